"""Issue 39 item 1: the core in packages, with a one-way import order.

`gpucluster/` keeps at most 12 modules of its own (the types and contract everything shares); the
rest lives in packages, each at a level. A module may import from its own level and below, never
above, by any spelling (`tests/test_layout.py`'s `all_imports`: relative imports, imports inside
functions or under `if TYPE_CHECKING:`, `importlib.import_module` of a constant). The programs that
run on nodes (`node/`) import nothing of gpucluster at all: they are copied to a node as they are.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from test_layout import ROOT, _module_name, _rel, all_imports

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

# low to high; "" is the top-level modules of gpucluster/ (and `gpucluster` itself)
ORDER = ("node", "", "catalog", "ledger", "costing", "watch", "plan", "lifecycle", "sweep")
OUTSIDE = ("infra", "cli", "api", "workloads")  # mapped folders: composition roots and the workloads
MAX_TOP_MODULES = 12
CORE = sorted(p for p in (ROOT / "gpucluster").rglob("*.py")
              if not any(part in ("data", "__pycache__") for part in p.relative_to(ROOT).parts))


def level(module: str) -> int | None:
    """The level of a `gpucluster...` module, None outside the core (infra, cli, api, workloads)."""
    parts = module.split(".")
    if parts[0] != "gpucluster":
        return None
    if len(parts) == 1 or parts[1] not in (*ORDER, *OUTSIDE):
        return ORDER.index("")
    return None if parts[1] in OUTSIDE else ORDER.index(parts[1])


def upward_imports(path: Path) -> list[str]:
    module = _module_name(path)
    own = level(module)
    assert own is not None, module
    found = []
    for line, target in all_imports(ast.parse(path.read_text()), module, path.name == "__init__.py"):
        theirs = level(target)
        if theirs is None:
            continue  # infra (only the contract: test_layout), workloads
        if ORDER[own] == "node" or theirs > own:
            found.append(f"{target} (line {line})")
    return found


def test_every_package_of_the_core_has_a_level():
    packages = {p.name for p in (ROOT / "gpucluster").iterdir() if (p / "__init__.py").is_file()}
    assert packages == {n for n in ORDER if n}, "a new package of gpucluster/ needs its place in ORDER"


def test_at_most_12_modules_are_left_directly_in_gpucluster():
    top = sorted(p.name for p in (ROOT / "gpucluster").glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top


def test_the_order_check_sees_an_upward_import(tmp_path, monkeypatch):
    code = ("from gpucluster.lifecycle.steps import execute\nfrom gpucluster.errors import UsageError\n"
            "def f():\n    from gpucluster.sweep import runner\n")
    assert level("gpucluster.ledger.store") == ORDER.index("ledger") and level("gpucluster.errors") == 1
    assert level("gpucluster.infra.contract") is None
    theirs = [level(t) for _, t in all_imports(ast.parse(code), "gpucluster.watch.launch")]
    assert [t for t in theirs if t is not None and t > ORDER.index("watch")] == [ORDER.index("lifecycle"),
                                                                                 ORDER.index("sweep")]


@pytest.mark.parametrize("path", CORE, ids=_rel)
def test_no_module_imports_from_a_higher_level(path):
    found = upward_imports(path)
    where = _module_name(path).split(".")
    assert found == [], (
        f"{_rel(path)} (level {where[1] if len(where) > 2 else 'top'}) imports "
        + ", ".join(found) + f": the order is {' < '.join(n or 'top-level modules' for n in ORDER)}; "
        "move the shared part down, or take it as an argument")
