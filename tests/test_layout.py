"""The layout rules of issue 11, checked on the whole source tree by reading it (`ast`):

- outside the backend packages (`infra/<name>/`) and the registry, no module compares a cloud's
  name (`cloud == "aws"`, `cloud in ("local", "ssh")`, `"gcp" in clouds`) nor imports a backend
  package: the core and the CLI reach backends through `infra/registry.py` and the contract;
- every part shared code reaches on a backend (`plugin(name).X`, `traits(name).X`) is declared by
  the contract (`Plugin`, `Traits`), so nothing needs probing with `getattr`;
- no source file is over about 500 lines;
- the registry and every backend package import no cloud SDK or torch.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from gpucluster.infra.contract import Plugin, Traits
from gpucluster.infra.registry import NAMES, PACKAGES

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIRS = ("gpucluster", "infra", "cli", "stacks", "workloads")
BACKEND_DIRS = {ROOT / "infra" / name for name in NAMES}
SHARED = sorted(p for d in SOURCE_DIRS for p in (ROOT / d).rglob("*.py")
                if not any(parent in BACKEND_DIRS for parent in p.parents) and p.name != "registry.py")
ALL_SOURCE = sorted(p for d in SOURCE_DIRS for p in (ROOT / d).rglob("*.py"))


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def _names_a_cloud(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_cloud(e) for e in node.elts)
    return False


def cloud_comparisons(tree: ast.AST) -> list[int]:
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Compare)
            and any(_names_a_cloud(x) for x in [n.left, *n.comparators])]


def backend_imports(tree: ast.AST) -> list[str]:
    out = []
    for n in ast.walk(tree):
        mods = [a.name for a in n.names] if isinstance(n, ast.Import) else \
            [n.module or ""] if isinstance(n, ast.ImportFrom) else []
        if isinstance(n, ast.ImportFrom) and n.module == "gpucluster.infra":
            mods = [f"gpucluster.infra.{a.name}" for a in n.names]
        out += [m for m in mods if any(m == p or m.startswith(p + ".") for p in PACKAGES.values())]
    return out


def test_the_checks_see_what_they_are_meant_to_catch():
    tree = ast.parse('if cloud == "aws" or c in ("local", "ssh") or "gcp" in clouds: pass\n'
                     'from gpucluster.infra.aws.catalog import DEFAULT_REGION\n'
                     'from gpucluster.infra import gcp\nimport gpucluster.infra.ssh.launch\n')
    assert cloud_comparisons(tree) == [1, 1, 1]
    assert backend_imports(tree) == ["gpucluster.infra.aws.catalog", "gpucluster.infra.gcp",
                                     "gpucluster.infra.ssh.launch"]
    assert cloud_comparisons(ast.parse('if kind == "instance" or name == "gpucluster": pass')) == []


CORE = sorted((ROOT / "gpucluster").rglob("*.py"))
# Core modules that still look a backend up by name (issue 23, item 2): none left. The list may only shrink.
CORE_STILL_USING_THE_REGISTRY: set[str] = set()


def registry_imports(tree: ast.AST) -> list[int]:
    return [n.lineno for n in ast.walk(tree)
            if (isinstance(n, ast.ImportFrom) and (n.module or "").endswith("infra.registry"))
            or (isinstance(n, ast.ImportFrom) and n.module == "gpucluster.infra"
                and any(a.name == "registry" for a in n.names))
            or (isinstance(n, ast.Import) and any(a.name.endswith("infra.registry") for a in n.names))]


def test_the_registry_import_check_sees_every_spelling():
    tree = ast.parse("from gpucluster.infra.registry import plugin\nfrom gpucluster.infra import registry\n"
                     "import gpucluster.infra.registry\ndef f():\n    from gpucluster.infra.registry import NAMES\n")
    assert registry_imports(tree) == [1, 2, 3, 5]


@pytest.mark.parametrize("path", CORE, ids=_rel)
def test_core_modules_do_not_look_backends_up(path):
    """The registry is consulted at the composition roots (cli/, infra/program.py); the core gets
    the plugin or its parts as arguments."""
    found = registry_imports(ast.parse(path.read_text()))
    if _rel(path) in CORE_STILL_USING_THE_REGISTRY:
        assert found, f"{_rel(path)} no longer imports the registry: remove it from the list"
    else:
        assert found == [], f"{_rel(path)} imports the registry (lines {found}): take the plugin as an argument"


@pytest.mark.parametrize("path", SHARED, ids=_rel)
def test_shared_modules_never_name_a_cloud_in_a_branch_nor_import_a_backend(path):
    tree = ast.parse(path.read_text())
    assert cloud_comparisons(tree) == [], f"{_rel(path)} branches on a cloud's name"
    assert backend_imports(tree) == [], f"{_rel(path)} imports a backend package (use the registry)"


def test_every_part_reached_through_the_registry_is_declared_by_the_contract():
    called = set()
    for path in ALL_SOURCE:
        for n in ast.walk(ast.parse(path.read_text())):
            # plugin(x).part / traits(x).fact
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Call) and \
                    getattr(n.value.func, "id", None) in ("plugin", "traits"):
                called.add((n.value.func.id, n.attr, _rel(path), n.lineno))
    assert called, "no plugin(...).part call found: the scan is broken"
    declared = {"plugin": set(Plugin.__dataclass_fields__) | set(dir(Plugin)),
                "traits": set(Traits.__dataclass_fields__) | set(dir(Traits))}
    missing = sorted(c for c in called if c[1] not in declared[c[0]])
    assert missing == []


@pytest.mark.parametrize("path", ALL_SOURCE, ids=_rel)
def test_no_source_file_is_over_about_500_lines(path):
    assert len(path.read_text().splitlines()) <= 500


def test_registry_and_backend_packages_import_no_sdk():
    code = ("import sys; from gpucluster.infra.registry import NAMES, traits; "
            "[(traits(n).name, traits(n).flags, traits(n).capabilities) for n in NAMES]; "
            "heavy = ('torch', 'boto3', 'pulumi', 'pulumi_aws', 'pulumi_gcp', 'google.cloud', 'kubernetes', 'rich'); "
            "print([m for m in heavy if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# -- events and UI: one protocol (gpucluster.events.RunEvents, lifecycle.RunUI), never probed ----
_EVENT_OBJECTS = {"events", "ui", "rec", "recorder", "sink"}


def _is_event_object(node: ast.AST) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return name is not None and (name in _EVENT_OBJECTS or name.endswith(("_events", "_ui")))


def event_probes(tree: ast.AST) -> list[int]:
    """Lines that look an event or UI method up by probing: hasattr(events, ...), getattr(ui, ...)."""
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("hasattr", "getattr")
            and n.args and _is_event_object(n.args[0])]


def test_the_event_probe_check_sees_a_probe():
    caught = ("if hasattr(events, 'on_spawn'):\n    events.on_spawn(0, 'process', '1')\n"
              "show = getattr(self.ui, 'progress', None)\nprogress = getattr(run_events, 'progress', None)\n")
    assert event_probes(ast.parse(caught)) == [1, 3, 4]
    assert event_probes(ast.parse("getattr(spec, 'zone', None)\nhasattr(exc, 'reason')\n")) == []


@pytest.mark.parametrize("path", ALL_SOURCE, ids=_rel)
def test_no_event_or_ui_method_is_found_by_probing(path):
    probes = event_probes(ast.parse(path.read_text()))
    assert not probes, (f"{_rel(path)} lines {probes}: an event or UI method looked up with hasattr/getattr; "
                        "declare it in gpucluster.events.RunEvents (or lifecycle.RunUI) and call it")
