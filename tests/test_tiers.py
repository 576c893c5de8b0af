"""The test tiers (issue 39, item 7; tests/conftest.py's docstring, docs/testing.md): every test file
names its tier at its top, so a newcomer sees where a test runs, and `make test-fast` (the unit tier)
selects exactly what conftest says it does. Read from the source with `ast`: nothing is imported."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import FAST_TIER, HEAVY_TIERS, ROOT, TIERS

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

TESTS = ROOT / "tests"


def module_marks(path: Path) -> list[str] | None:
    """The marker names of the file's module-level `pytestmark` (None: it has none)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                for t in node.targets):
            values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            names = []
            for v in values:
                v = v.func if isinstance(v, ast.Call) else v  # pytest.mark.skipif(...) -> pytest.mark.skipif
                if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Attribute) and v.value.attr == "mark":
                    names.append(v.attr)
            return names
    return None


def test_every_test_file_names_its_tier_at_its_top():
    files = sorted(TESTS.glob("test_*.py"))
    assert len(files) > 50
    missing, mixed = [], []
    for f in files:
        marks = module_marks(f)
        tiers = [m for m in (marks or []) if m in TIERS]
        if not tiers:
            missing.append(f.name)
        elif "unit" in tiers and len(tiers) > 1:
            mixed.append(f.name)
    assert not missing, (
        f"these test files name no tier: {missing}; add after the imports, e.g.\n"
        "    pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)\n"
        f"with one of {TIERS} (tests/conftest.py says which)")
    assert not mixed, f"a file is `unit` or heavier, not both (mark the heavier tests one by one): {mixed}"


def test_the_markers_are_registered():
    text = (ROOT / "pyproject.toml").read_text()
    for tier in TIERS:
        assert f'"{tier}: ' in text, f"marker {tier!r} is not registered in pyproject.toml"


def test_make_test_fast_selects_the_unit_tier_and_make_test_runs_mypy():
    make = (ROOT / "Makefile").read_text()
    m = re.search(r"^FAST_TIER := (.+)$", make, re.M)
    assert m and m.group(1).strip() == FAST_TIER, (m and m.group(1), FAST_TIER)
    assert set(HEAVY_TIERS) == {w for w in FAST_TIER.split() if w not in ("not", "and")}
    recipe = make.split("\ntest: ", 1)[1].split("\n\n", 1)[0]
    assert ".ci/typecheck.py" in recipe and "-m alone" in recipe


def test_the_check_reads_marks_as_pytest_does(tmp_path):
    f = tmp_path / "test_x.py"
    f.write_text("import pytest\npytestmark = [needs_torch, pytest.mark.slow, pytest.mark.skipif(True, reason='r')]\n")
    assert module_marks(f) == ["slow", "skipif"]
    f.write_text("import pytest\n\ndef test_a():\n    pass\n")
    assert module_marks(f) is None
