"""Count string-key lookups (`x["key"]`, `x.get("key")`) in the run-record readers: the renderers,
sweep facts and the cost code (issue 23 item 5). `python benchmarks/key_lookups.py [FILE...]`."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ["cli/render.py", "gpucluster/sweep/runner.py", "gpucluster/costing/cost.py", *sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "gpucluster/costing").glob("*.py"))]


def lookups(path: Path) -> int:
    n = 0
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            n += 1
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            n += 1
    return n


if __name__ == "__main__":
    total = 0
    for name in sys.argv[1:] or DEFAULT:
        n = lookups(ROOT / name)
        total += n
        print(f"{n:5d}  {name}")
    print(f"{total:5d}  total")
