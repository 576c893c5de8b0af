"""Functions over a McCabe complexity (issue 39 item 4), counted the simple way the issue names:
1 + branches (if/elif, conditional expressions), loops, boolean operators (each extra operand),
exception handlers, comprehensions (each `for` and `if` in them), match cases, asserts with a
message are not counted. Nested functions and classes are counted on their own.

    python benchmarks/complexity.py [--over 20] [DIR ...]     (default: gpucluster infra cli api)
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class _Counter(ast.NodeVisitor):
    def __init__(self) -> None:
        self.n = 1

    def generic_visit(self, node: ast.AST) -> None:
        if isinstance(node, (ast.If, ast.IfExp, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler)):
            self.n += 1
        elif isinstance(node, ast.BoolOp):
            self.n += len(node.values) - 1
        elif isinstance(node, ast.comprehension):
            self.n += 1 + len(node.ifs)
        elif isinstance(node, ast.match_case):
            self.n += 1
        super().generic_visit(node)

    def visit_FunctionDef(self, node: ast.AST) -> None:  # nested: counted on their own
        return

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_ClassDef = visit_FunctionDef
    visit_Lambda = generic_visit


def complexity(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    c = _Counter()
    for stmt in fn.body:
        c.visit(stmt)
    return c.n


def functions(dirs: list[str]) -> list[tuple[int, str]]:
    out = []
    for d in dirs:
        for path in sorted((ROOT / d).rglob("*.py")):
            tree = ast.parse(path.read_text())
            stack: list[tuple[ast.AST, str]] = [(tree, "")]
            while stack:
                node, prefix = stack.pop()
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        name = f"{prefix}{child.name}"
                        out.append((complexity(child), f"{path.relative_to(ROOT)}:{child.lineno} {name}"))
                        stack.append((child, name + "."))
                    elif isinstance(child, ast.ClassDef):
                        stack.append((child, f"{prefix}{child.name}."))
                    else:
                        stack.append((child, prefix))
    return sorted(out, reverse=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--over", type=int, default=20)
    ap.add_argument("dirs", nargs="*", default=["gpucluster", "infra", "cli", "api"])
    args = ap.parse_args()
    found = functions(args.dirs)
    over = [(n, f) for n, f in found if n > args.over]
    for n, f in over:
        print(f"{n:4d}  {f}")
    print(f"{len(found)} functions; {len(over)} over {args.over}; {sum(n > 30 for n, _ in found)} over 30; "
          f"highest {found[0][0] if found else 0}")


if __name__ == "__main__":
    main()
