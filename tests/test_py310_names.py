"""The code runs on Python 3.10 to 3.13 (pyproject: requires-python >= 3.10): no module, test or
benchmark may use a standard-library name added in 3.11 or later, nor newer syntax. A cheap
static check, so a 3.11-only name fails here on 3.11 before it breaks imports on 3.10 (as
`class Phase(enum.StrEnum)` once did: run/up/sweep could not start on 3.10).

What is newer than 3.10 is taken from the "What's New In Python" pages of 3.11, 3.12 and 3.13
(docs.python.org/3/whatsnew/): the names below, and the syntax `ast.parse(feature_version=(3, 10))`
refuses (`except*`, PEP 695 `type` statements and generic classes)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("gpucluster", "infra", "workloads", "cli", "stacks", "benchmarks", "tests")

# module -> names it gained after 3.10
NEWER: dict[str, set[str]] = {
    "enum": {"StrEnum", "ReprEnum", "EnumCheck", "verify", "member", "nonmember", "global_enum", "FlagBoundary",
             "property", "EnumType", "show_flag_values"},
    "typing": {"Self", "LiteralString", "Never", "assert_never", "assert_type", "reveal_type", "Required",
               "NotRequired", "TypeVarTuple", "Unpack", "dataclass_transform", "override", "TypeAliasType",
               "get_overloads", "clear_overloads", "ReadOnly", "TypeIs", "get_protocol_members", "is_protocol",
               "NoDefault"},
    "datetime": {"UTC"},
    "asyncio": {"TaskGroup", "timeout", "timeout_at", "Timeout", "Runner", "Barrier", "BrokenBarrierError",
                "eager_task_factory", "create_eager_task_factory", "QueueShutDown"},
    "contextlib": {"chdir"},
    "hashlib": {"file_digest"},
    "operator": {"call"},
    "itertools": {"batched"},
    "re": {"NOFLAG", "PatternError"},
    "logging": {"getLevelNamesMapping", "getHandlerByName", "getHandlerNames"},
    "math": {"exp2", "cbrt", "sumprod", "fma"},
    "inspect": {"markcoroutinefunction", "getasyncgenstate", "getasyncgenlocals", "BufferFlags"},
    "sqlite3": {"Blob"},
    "os": {"process_cpu_count", "EX_NOTFOUND"},
    "copy": {"replace"},
    "warnings": {"deprecated"},
    "types": {"get_original_bases", "CapsuleType"},
    "queue": {"ShutDown"},
    "calendar": {"Month", "Day"},
}
NEW_MODULES = {"tomllib", "wsgiref.types"}
NEW_BUILTINS = {"ExceptionGroup", "BaseExceptionGroup", "PythonFinalizationError"}


def _sources() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py") if ".venv" not in p.parts)


def newer_names(source: str) -> list[str]:
    """The post-3.10 standard-library names or syntax `source` uses, as 'line: what'."""
    try:
        tree = ast.parse(source, feature_version=(3, 10))
    except SyntaxError as exc:
        return [f"{exc.lineno}: syntax newer than 3.10 ({exc.msg})"]
    aliases: dict[str, str] = {}  # local name -> module, from `import enum` / `import typing as t`
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in NEW_MODULES:
                    found.append(f"{node.lineno}: import {a.name} (3.11+)")
                aliases[a.asname or a.name.split(".")[0]] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in NEW_MODULES:
                found.append(f"{node.lineno}: from {node.module} import ... (3.11+)")
            for a in node.names:
                if a.name in NEWER.get(node.module, ()):
                    found.append(f"{node.lineno}: from {node.module} import {a.name} (3.11+)")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = aliases.get(node.value.id)
            if module and node.attr in NEWER.get(module, ()):
                found.append(f"{node.lineno}: {node.value.id}.{node.attr} ({module}, 3.11+)")
        elif isinstance(node, ast.Name) and node.id in NEW_BUILTINS and isinstance(node.ctx, ast.Load):
            found.append(f"{node.lineno}: {node.id} (builtin, 3.11+)")
    return found


def test_no_source_uses_a_standard_library_name_newer_than_python_3_10():
    sources = _sources()
    assert len(sources) > 100  # the scan sees the tree
    bad = {str(p.relative_to(ROOT)): hits for p in sources
           if p.name != Path(__file__).name and (hits := newer_names(p.read_text(encoding="utf-8")))}
    assert not bad, bad


@pytest.mark.parametrize("source", [
    "import enum\nclass Phase(str, enum.StrEnum):\n    A = 'a'\n",
    "from enum import StrEnum\n",
    "import tomllib\n",
    "from typing import Self\n",
    "import typing as t\nx: t.Self\n",
    "import datetime\nnow = datetime.datetime.now(datetime.UTC)\n",
    "try:\n    pass\nexcept* ValueError:\n    pass\n",
    "raise ExceptionGroup('x', [ValueError()])\n",
    "type Alias = int\n",
    "import contextlib\nwith contextlib.chdir('/'):\n    pass\n",
])
def test_the_check_catches_what_broke_3_10_and_its_kin(source):
    assert newer_names(source)


def test_the_check_leaves_3_10_code_alone():
    assert newer_names("import enum\nclass Phase(str, enum.Enum):\n    A = 'a'\n"
                       "from typing import Any, Callable\nimport datetime\n"
                       "t = datetime.timezone.utc\nmatch 1:\n    case 1:\n        pass\n") == []
