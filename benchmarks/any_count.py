"""Count the annotations that mention `Any` (issue 39 item 2): function parameter and return
annotations, variable annotations (`x: T = ...`, class fields) and type aliases (`Row = dict[str,
Any]`, so an alias does not hide one) whose source names `Any`.

    python benchmarks/any_count.py                 total over gpucluster/, infra/, cli/ and the 20 files with most
    python benchmarks/any_count.py --seams         the same for the seam modules only (the contract,
                                                   lifecycle, recovery, teardown, kept, prepare, launch), each listed
    python benchmarks/any_count.py FILE...         those files, each listed
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ["gpucluster", "infra", "cli"]
# The modules whose signatures issue 39 item 2 wants free of `Any` (at most 10 left, each with a
# `# Any: why` comment).
SEAMS = ["infra/contract.py", "infra/registry.py", "gpucluster/domain.py", "gpucluster/watch/launch.py",
         "gpucluster/lifecycle/steps.py", "gpucluster/lifecycle/recovery.py", "gpucluster/lifecycle/teardown.py", "gpucluster/lifecycle/kept.py",
         "gpucluster/lifecycle/held.py", "gpucluster/lifecycle/prepare.py"]
ANY = re.compile(r"\bAny\b")


def _mentions_any(node: ast.expr | None) -> bool:
    return node is not None and bool(ANY.search(ast.unparse(node)))


def annotations(tree: ast.AST) -> list[ast.expr]:
    """Every parameter, return and variable annotation in a module, and every alias-shaped value."""
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(p for p in (a.vararg, a.kwarg) if p)]
            found += [p.annotation for p in params if p.annotation is not None]
            if node.returns is not None:
                found.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            found.append(node.annotation)
            if node.value is not None and ast.unparse(node.annotation).endswith("TypeAlias"):
                found.append(node.value)  # `Client: TypeAlias = Any` counts like `Client = Any`
        elif isinstance(node, ast.Assign) and isinstance(node.value, (ast.Subscript, ast.BinOp, ast.Name, ast.Attribute)):
            # a type alias (`Row = dict[str, Any]`, `Client = Any`; an indexing expression or a plain
            # assignment is only counted when it names Any), so an alias is counted once where it is made
            found.append(node.value)
    return found


def count(path: Path) -> int:
    return sum(_mentions_any(a) for a in annotations(ast.parse(path.read_text(), str(path))))


def files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def main(argv: list[str]) -> int:
    if argv[:1] == ["--seams"]:
        chosen, top = [ROOT / s for s in SEAMS], None
    elif argv:
        chosen, top = [Path(a).resolve() for a in argv], None
    else:
        chosen, top = files(), 20
    counts = sorted(((count(p), p) for p in chosen), key=lambda cp: -cp[0])
    total = sum(n for n, _ in counts)
    for n, p in counts[:top]:
        print(f"{n:5d}  {p.relative_to(ROOT)}")
    print(f"{total:5d}  total ({len(chosen)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
