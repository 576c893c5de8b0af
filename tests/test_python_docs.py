"""Issue 47, item 1: every example of docs/python.md runs as written, in order, in one namespace per
block, on the local backend (a fresh home; SLACK_WEBHOOK_URL pointed at a webhook on loopback). A block
fenced ```python cloud needs a cloud account: it is compiled and every `gpucluster.X` it names
must exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import ROOT, needs_torch
from test_notify import Hook

pytestmark = [needs_torch, pytest.mark.slow]

DOC = ROOT / "docs" / "python.md"
FENCE = re.compile(r"^```python( cloud)?\n(.*?)^```$", re.S | re.M)


def blocks() -> list[tuple[bool, str]]:
    return [(bool(m.group(1)), m.group(2)) for m in FENCE.finditer(DOC.read_text())]


def test_the_page_has_examples_of_every_part():
    text = "\n".join(code for _, code in blocks())
    for name in ("run", "runs", "show", "logs", "estimate", "up", "exec", "down"):
        assert re.search(rf"\b{name}\(", text), name
    assert sum(cloud for cloud, _ in blocks()) == 1  # only the kept cluster's needs a cloud
    assert all(any(k in code for k in EXPECT) for _, code in LOCAL)  # each example has its check


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One home and one webhook for the page's examples, run in order (a later one reads the runs of
    the earlier ones, as a reader of the page would have made them)."""
    mp = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("python-docs")
    mp.setenv("GPUCLUSTER_HOME", str(root / "home"))
    hook = Hook()
    mp.setenv("SLACK_WEBHOOK_URL", hook.url)
    mp.chdir(root)
    yield hook
    hook.close()
    mp.undo()


LOCAL = [(i, code) for i, (cloud, code) in enumerate(blocks()) if not cloud]
EXPECT = {  # what each example shows, by a phrase of its code
    "print('hello')": "succeeded verified",
    "on_event": "event: succeeded",
    "SLACK_WEBHOOK_URL": "",
    "gpucluster.runs(limit=5)": "done",  # the last run's line (the webhook example)
    "estimate(": "g5.",
    "nodes=0": "nodes '0' is not allowed",
}


@pytest.mark.parametrize("index,code", LOCAL, ids=[f"example-{i + 1}" for i, _ in LOCAL])
def test_every_local_example_runs(shared, capsys, index, code):
    exec(compile(code, f"{DOC.name} example {index + 1}", "exec"), {"__name__": f"example_{index + 1}"})
    out = capsys.readouterr().out
    phrase = next(v for k, v in EXPECT.items() if k in code)
    assert phrase in out, out[-2000:]
    if "SLACK_WEBHOOK_URL" in code:
        [body] = shared.bodies
        assert body["kind"] == "succeeded" and body["text"].startswith("gpucluster run ")


def test_the_cloud_example_compiles_and_names_only_what_exists():
    import gpucluster

    [code] = [code for cloud, code in blocks() if cloud]
    tree = ast.parse(code)
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "gpucluster"}
    assert used == {"up", "down"} or used <= set(gpucluster.API)
    assert all(hasattr(gpucluster.Cluster, m) for m in ("exec", "status", "down"))
    assert Path(DOC).read_text().count("```python") == len(blocks())  # no block is skipped by the pattern
