"""The layout rules of issue 11, checked on the whole source tree by reading it (`ast`):

- outside the backend packages (`infra/<name>/`) and the registry, no module compares a cloud's
  name (`cloud == "aws"`, `cloud in ("local", "ssh")`, `"gcp" in clouds`) nor imports a backend
  package: the core and the CLI reach backends through `infra/registry.py` and the contract;
- every part shared code reaches on a backend (`plugin(name).X`, `traits(name).X`) is declared by
  the contract (`Plugin`, `Traits`), so nothing needs probing with `getattr`;
- (issue 39 item 1) the 500-line cap that stood here is gone: tests/test_package_order.py is the layout
  rule now, and a module may be long when it is one thing;
- the registry and every backend package import no cloud SDK or torch;
- (issue 23, item 2) no core module (`gpucluster/*`) imports an infra module but the contract: the
  registry is consulted only at the composition roots (`cli/`, `infra/program.py`).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from gpucluster.infra.contract import Plugin, Traits
from gpucluster.infra.registry import NAMES, PACKAGES

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIRS = ("gpucluster", "infra", "cli", "api", "stacks", "workloads")
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
# Issue 23, item 2 ("composition roots only"): the registry is consulted once per command (cli/) and
# once in the Pulumi program (infra/program.py); the core (gpucluster/*, not cli/ nor infra/) receives
# the plugin or its parts as arguments and imports no infra module, by any spelling. The one exception,
# and the list may only shrink: the contract itself, the plain typed parts and dataclasses the core's
# arguments are typed with (`Plugin`, `Pricing`, `Capability`, `LaunchOptions`); at run time it imports
# only gpucluster.errors, and it lives in infra/ beside the backends that implement it.
CORE_MAY_IMPORT = {"gpucluster.infra.contract"}
_IMPORTERS = {"import_module", "__import__"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def infra_imports(tree: ast.AST, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, module) of every import of `gpucluster.infra` or a module under it in the module
    `module`: `import x.y`, `from x.y import z`, `from x import y` (a submodule), relative imports,
    imports inside functions or `if TYPE_CHECKING:`, and `importlib.import_module("...")` /
    `__import__("...")` of a constant name."""
    return [(line, t) for line, t in all_imports(tree, module, is_package)
            if t == "gpucluster.infra" or t.startswith("gpucluster.infra.")]


def all_imports(tree: ast.AST, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, module) of every import in the module `module`, by any of the spellings `infra_imports`
    names (relative ones resolved; `from x import y` gives x.y where x is gpucluster or gpucluster.infra,
    else x)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: list[tuple[int, str]] = []
    for n in ast.walk(tree):
        targets: list[str] = []
        if isinstance(n, ast.Import):
            targets = [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            base = (package[:len(package) - n.level + 1] if n.level else []) + (n.module.split(".") if n.module else [])
            name = ".".join(base)
            # `from gpucluster import infra`, `from gpucluster.infra import registry`: the names may be modules
            targets = [f"{name}.{a.name}" for a in n.names] if name in ("gpucluster", "gpucluster.infra") else [name]
        elif isinstance(n, ast.Call) and n.args and isinstance(n.args[0], ast.Constant) and \
                isinstance(n.args[0].value, str) and (getattr(n.func, "attr", None) in _IMPORTERS
                                                      or getattr(n.func, "id", None) in _IMPORTERS):
            targets = [n.args[0].value]
        found += [(n.lineno, t) for t in targets]
    return found


def test_the_infra_import_check_sees_every_spelling():
    code = ("from gpucluster.infra.registry import plugin\nfrom gpucluster.infra import registry, contract\n"
            "import gpucluster.infra.registry\nif TYPE_CHECKING:\n    from gpucluster.infra.aws.catalog import X\n"
            "def f():\n    from gpucluster.infra.registry import NAMES\n    import gpucluster.infra as infra\n"
            "from ..infra.ssh import launch\nfrom .. import infra\nimportlib.import_module('gpucluster.infra.gcp')\n"
            "__import__('gpucluster.infra.registry')\nfrom gpucluster.infra.contract import Plugin\n"
            "from gpucluster.errors import UsageError\nfrom .plan import known\nimport gpucluster.infrastructure\n"
            "from gpucluster import errors, infra\n")
    assert sorted(infra_imports(ast.parse(code), "gpucluster.costing.plan")) == [
        (1, "gpucluster.infra.registry"), (2, "gpucluster.infra.contract"), (2, "gpucluster.infra.registry"),
        (3, "gpucluster.infra.registry"), (5, "gpucluster.infra.aws.catalog"), (7, "gpucluster.infra.registry"),
        (8, "gpucluster.infra"), (9, "gpucluster.infra.ssh"), (10, "gpucluster.infra"), (11, "gpucluster.infra.gcp"),
        (12, "gpucluster.infra.registry"), (13, "gpucluster.infra.contract"), (17, "gpucluster.infra")]
    # a package's own relative imports resolve from the package itself
    assert infra_imports(ast.parse("from ..infra import registry\n"), "gpucluster.catalog", is_package=True) == \
        [(1, "gpucluster.infra.registry")]


def test_the_core_is_found():
    names = {_rel(p) for p in CORE}
    assert {"gpucluster/watch/staging.py", "gpucluster/catalog/prices.py", "gpucluster/costing/plan.py"} <= names
    assert not any(n.startswith(("infra/", "cli/")) for n in names)


@pytest.mark.parametrize("path", CORE, ids=_rel)
def test_core_modules_import_no_infra_module(path):
    """The registry is consulted at the composition roots (cli/, infra/program.py); the core gets
    the plugin or its parts as arguments, and imports nothing from infra/ but the contract."""
    found = [(line, mod) for line, mod in infra_imports(ast.parse(path.read_text()), _module_name(path),
                                                         path.name == "__init__.py")
             if mod not in CORE_MAY_IMPORT]
    assert found == [], (
        f"{_rel(path)} imports " + ", ".join(f"{mod} (line {line})" for line, mod in found)
        + ": a core module takes the backend's plugin, or the part it needs, as an argument from its caller "
          "(the CLI command or the Pulumi program, which look it up in infra/registry.py); it imports no infra "
          "module but gpucluster.infra.contract")


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


# -- issue 39, item 5: infra/kubernetes/ is plain Kubernetes -----------------------------------------
# The launcher, staging, outputs, exec/ssh/port-forward and the health check are shared by every backend
# whose jobs run as pods (gcp today; `--cloud kubernetes`, existing clusters, next): what a provider adds
# is injected (`infra.kubernetes.platform.Platform`; gcp's is infra/gcp/gke.py), never imported.
KUBERNETES = sorted((ROOT / "infra" / "kubernetes").rglob("*.py"))
NOT_IN_KUBERNETES = ("gpucluster.infra.gcp", "gpucluster.infra.aws", "google", "boto3", "botocore")


def cloud_imports(tree: ast.AST, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    return [(line, t) for line, t in all_imports(tree, module, is_package)
            if any(t == p or t.startswith(p + ".") for p in NOT_IN_KUBERNETES)]


def test_the_cloud_import_check_sees_every_spelling():
    code = ("def f():\n    from gpucluster.infra.gcp.access import GcpAuthError\nfrom ..gcp import gcs\n"
            "import google.auth\nimportlib.import_module('boto3')\nfrom gpucluster.infra import aws\n"
            "from .api import KubeApi\nimport kubernetes\nfrom gpucluster.watch.staging import STAGE_PY\n"
            "import googleapiclient\n")
    assert sorted(cloud_imports(ast.parse(code), "gpucluster.infra.kubernetes.launcher")) == [
        (2, "gpucluster.infra.gcp.access"), (3, "gpucluster.infra.gcp"), (4, "google.auth"), (5, "boto3"),
        (6, "gpucluster.infra.aws")]


def test_the_kubernetes_package_is_found_and_is_not_a_backend():
    names = {p.name for p in KUBERNETES}
    assert {"launcher.py", "api.py", "plan.py", "stage.py", "outputs.py", "check.py", "connect.py"} <= names
    from gpucluster.infra.registry import PACKAGES

    # the `kubernetes` backend (existing clusters) is its own package, infra/kube; the shared engines are none
    assert "gpucluster.infra.kubernetes" not in PACKAGES.values() and "pulumi" not in NAMES
    assert PACKAGES["kubernetes"] == "gpucluster.infra.kube"


@pytest.mark.parametrize("path", KUBERNETES, ids=_rel)
def test_the_kubernetes_package_imports_no_cloud(path):
    module = "gpucluster." + _module_name(path)
    found = cloud_imports(ast.parse(path.read_text()), module, path.name == "__init__.py")
    assert found == [], (f"{_rel(path)} imports " + ", ".join(f"{m} (line {line})" for line, m in found)
                         + ": infra/kubernetes/ is plain Kubernetes; what a provider adds is given to it "
                           "(infra.kubernetes.platform.Platform), not imported")


# -- (issue 39 item 1) no import circle inside an infra package -------------------------------------------
INFRA_PACKAGES = sorted(p for p in (ROOT / "infra").iterdir() if (p / "__init__.py").is_file())


def sibling_imports(sources: dict[str, str], package: str) -> dict[str, set[str]]:
    """{module: the modules of the same package it imports} for `sources` ({module name: text}), by every
    spelling: `from . import a`, `from .a import x`, `from gpucluster.infra.<package>[.a] import ...`,
    at module level, inside functions and under TYPE_CHECKING (a circle dodged by a late import is still one)."""
    full = f"gpucluster.infra.{package}"
    graph: dict[str, set[str]] = {m: set() for m in sources}
    for module, text in sources.items():
        for n in ast.walk(ast.parse(text)):
            if not isinstance(n, ast.ImportFrom):
                continue
            if n.level == 1:
                base = n.module or ""
            elif n.level == 0 and n.module and (n.module == full or n.module.startswith(full + ".")):
                base = n.module[len(full):].lstrip(".")
            else:
                continue
            named = [base.split(".")[0]] if base else [a.name for a in n.names]
            graph[module] |= {m for m in named if m in sources and m != module}
    return graph


def test_the_circle_check_sees_late_and_type_only_imports():
    import graphlib

    sources = {"a": "def f():\n    from .b import x\n", "b": "if TYPE_CHECKING:\n    from gpucluster.infra.p import a\n",
               "c": "from . import a\n"}
    graph = sibling_imports(sources, "p")
    assert graph == {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter(graph).prepare()


@pytest.mark.parametrize("folder", INFRA_PACKAGES, ids=lambda p: p.name)
def test_no_import_circle_inside_an_infra_package(folder):
    import graphlib

    sources = {p.stem: p.read_text() for p in folder.glob("*.py") if p.name != "__init__.py"}
    graph = sibling_imports(sources, folder.name)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"infra/{folder.name}: modules import each other in a circle: {' -> '.join(exc.args[1])}; "
                    "move the shared piece into a module below both")
