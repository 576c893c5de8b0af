"""Count the names of the backend contract and which backends use each (issue 39 item 6).

    python benchmarks/contract_names.py            a table: each name, the backends that set or override it
    python benchmarks/contract_names.py --summary  the totals only

A name is a field of one of the plugin's parts (`Traits`, `Transport`, `SpecRules`, `Operations`,
`Provisioner`, `Pricing`, `ObjectStore`; infra/contract.py) or a public method of the
`Provider` (gpucluster/domain.py) or `Launcher` (gpucluster/watch/launch.py) bases. A backend uses a
part's field when its `PLUGIN` gives it a value other than the part's default; it uses a method when
a class of its own (or a shared base it inherits, e.g. infra/pulumi's provider) defines it. A name
is "used by all" when every registered backend uses it, "single" when exactly one does.

Two contracts are counted apart: the core's (the parts above, `Provider`, `Launcher`) and the shared
Pulumi engine's (`PulumiCloud`, infra/pulumi/cloud.py: the fields it adds to the core's `Provisioner`,
which only infra/pulumi, infra/program.py and infra/leftovers.py read). Every name is in one of them.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import pkgutil
import sys
from collections.abc import Iterable
from pathlib import Path

from gpucluster.domain import Provider
from gpucluster.infra import contract
from gpucluster.infra.pulumi.cloud import PulumiCloud
from gpucluster.infra.registry import PACKAGES, plugin
from gpucluster.watch.launch import Launcher

PARTS = ("traits", "transport", "spec", "ops", "provisioner", "pricing", "objects")
BASES = {"Provider": Provider, "Launcher": Launcher}
ENGINE = (PulumiCloud,)  # the Pulumi engine's parts: each extends a core part with fields only the engine reads


def _public_methods(cls: type) -> set[str]:
    return {n for n, v in vars(cls).items() if not n.startswith("_") and callable(v)}


def _part_class(part: str) -> type:
    hints = {f.name: f.type for f in dataclasses.fields(contract.Plugin)}
    name = str(hints[part]).split(" |")[0].strip("'\"")
    cls: type = vars(contract)[name]
    return cls


def _defaults(cls: type) -> dict[str, object]:
    out: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _label(cls: type, field: str) -> str:
    """"Part.field", named by the class that declares the field (a core part, or the engine's part that extends it)."""
    for klass in inspect.getmro(cls):
        if dataclasses.is_dataclass(klass) and field in vars(klass).get("__annotations__", {}):
            return f"{klass.__name__}.{field}"
    return f"{cls.__name__}.{field}"


def engine_names(table: dict[str, set[str]]) -> set[str]:
    return {k for k in table if k.split(".")[0] in {c.__name__ for c in ENGINE}}


def _modules(package: str) -> Iterable[str]:
    """The backend's modules that define a class (the node-side programs, which run when imported, define none)."""
    mod = importlib.import_module(package)
    for info in pkgutil.walk_packages(mod.__path__, package + "."):
        spec = importlib.util.find_spec(info.name)
        origin = spec.origin if spec is not None else None
        if origin and origin.endswith(".py") and \
                any(isinstance(n, ast.ClassDef) for n in ast.walk(ast.parse(Path(origin).read_text()))):
            yield info.name


def _imported_names(package: str) -> set[str]:
    """Every name a module of the backend package imports (`from x import Name`)."""
    mod = importlib.import_module(package)
    names: set[str] = set()
    for folder in mod.__path__:
        for path in Path(folder).rglob("*.py"):
            for n in ast.walk(ast.parse(path.read_text())):
                if isinstance(n, ast.ImportFrom):
                    names |= {a.name for a in n.names}
    return names


def _subclasses(base: type) -> list[type]:
    found, todo = [], list(base.__subclasses__())
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return found


def uses() -> dict[str, set[str]]:
    """{"Part.name": {backend, ...}} for every name of the contract."""
    table: dict[str, set[str]] = {}
    for part in PARTS:
        cls = _part_class(part)
        for f in dataclasses.fields(cls):
            table.setdefault(f"{cls.__name__}.{f.name}", set())
    for label, base in BASES.items():
        for m in _public_methods(base):
            table.setdefault(f"{label}.{m}", set())
    for cls in ENGINE:
        for f in dataclasses.fields(cls):
            table.setdefault(_label(cls, f.name), set())
    for name, package in PACKAGES.items():
        p = plugin(name)
        for part in PARTS:
            value = vars(p)[part]
            if value is None:
                continue
            cls = type(value)
            defaults = _defaults(cls)
            for f in dataclasses.fields(cls):
                if f.name not in defaults or vars(value)[f.name] != defaults[f.name]:
                    table[_label(cls, f.name)].add(name)
        for mod in list(_modules(package)):
            try:
                importlib.import_module(mod)
            except ImportError:  # a module that needs an SDK not installed here: its classes are not counted
                continue
        imported = _imported_names(package)
        for label, base in BASES.items():
            for cls in _subclasses(base):
                # its own classes, and shared ones it imports (infra/pulumi's provider, the ssh launcher on aws)
                if not cls.__module__.startswith(package + ".") and cls.__name__ not in imported:
                    continue
                for klass in inspect.getmro(cls):
                    if klass in base.__mro__:  # the base itself and above; a mixin (ssh_config, connect) counts
                        continue
                    for m in _public_methods(klass) & _public_methods(base):
                        table[f"{label}.{m}"].add(name)
    return table


def _totals(table: dict[str, set[str]], n: int) -> str:
    every = sum(1 for v in table.values() if len(v) == n)
    single = sum(1 for v in table.values() if len(v) == 1)
    unused = sum(1 for v in table.values() if not v)
    return f"{len(table)} names; {every} used by all {n} backends; {single} by one; {unused} by none"


def main(argv: list[str]) -> int:
    table = uses()
    n = len(PACKAGES)
    engine = engine_names(table)
    core = {k: v for k, v in table.items() if k not in engine}
    if argv[:1] != ["--summary"]:
        for key in sorted(table):
            print(f"{len(table[key])}  {key:45s} {', '.join(sorted(table[key]))}")
    parts: dict[str, int] = {}
    for key in core:
        parts[key.split(".")[0]] = parts.get(key.split(".")[0], 0) + 1
    print("core: " + _totals(core, n) + " (" + ", ".join(f"{p} {c}" for p, c in
                                                          sorted(parts.items(), key=lambda pc: (-pc[1], pc[0]))) + ")")
    print("Pulumi engine (" + ", ".join(c.__name__ for c in ENGINE) + "): " + _totals(
        {k: v for k, v in table.items() if k in engine}, n))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
