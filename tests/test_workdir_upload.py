"""The node side of the working-folder upload beside object-storage outputs (issue 28 item 1 with
`--output s3://...`/`gs://...`): `gpucluster/node/workdir.py --into DIR` run as the nodes run it (a
subprocess of the standard library program), and how `gpucluster.watch.outputs.workdir_pushed` reads the
upload script's answers, failures included. The end-to-end runs are in tests/test_aws_s3_run.py (S3)
and tests/test_k8s_workdir.py (GCS)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucluster.node import workdir
from gpucluster.watch.outputs import COMPLETE, PARTIAL, NodeOutputs, add_workdir, workdir_pushed, workdir_url

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

PROGRAM = Path(workdir.__file__)


def _job_folder(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "code"
    (root / "outputs").mkdir(parents=True)
    (root / "shipped.py").write_text("print('shipped')\n")
    marker = tmp_path / "shipped"
    marker.touch()
    old = time.time() - 60
    os.utime(root / "shipped.py", (old, old))
    os.utime(marker, (old + 1, old + 1))
    (root / "ckpt").mkdir()
    (root / "ckpt" / "a.pt").write_bytes(b"a" * 100)
    (root / "snapshot.pt").write_bytes(b"s" * 300)
    (root / "outputs" / "model.pt").write_bytes(b"m" * 10)  # the output folder goes on its own
    (root / "link").symlink_to(root / "snapshot.pt")  # links are never taken
    return root, marker


def test_into_links_the_chosen_files_names_what_is_over_and_leaves_the_rest(tmp_path):
    root, marker = _job_folder(tmp_path)
    stage = tmp_path / "stage"
    cp = subprocess.run([sys.executable, str(PROGRAM), str(root), "--since", str(marker), "--exclude", "outputs",
                         "--limit", "200", "--into", str(stage)], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0 and cp.stdout == "", cp.stderr
    answer = json.loads(cp.stderr.strip().splitlines()[-1])
    assert answer == {"files": 1, "bytes": 100, "over": ["snapshot.pt (300 B)"], "unreadable": []}
    assert sorted(p.relative_to(stage).as_posix() for p in stage.rglob("*") if p.is_file()) == ["ckpt/a.pt"]
    assert (stage / "ckpt" / "a.pt").stat().st_ino == (root / "ckpt" / "a.pt").stat().st_ino  # a link, not a copy
    # nothing chosen: the folder is still made, so the upload of an empty folder is a clean "0 files"
    empty = tmp_path / "empty-stage"
    cp = subprocess.run([sys.executable, str(PROGRAM), str(root), "--since", str(marker), "--collect", "*.none",
                         "--into", str(empty)], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0 and empty.is_dir() and not any(empty.iterdir())


def test_the_upload_answers_become_counts_and_named_problems():
    where = workdir_url("s3://out/runs/", "r1", 1)
    assert where == "s3://out/runs/r1/workdir/node-1"
    picked = json.dumps({"files": 2, "bytes": 400, "over": ["big.bin (30000 B)"], "unreadable": []})
    # uploaded; a file over the limit is named and makes the node partial
    files, nbytes, problems = workdir_pushed(where, "node 1 (h)", 0, json.dumps({"files": 2, "bytes": 400}),
                                             picked + "\n", 1.0, 20000)
    assert (files, nbytes) == (2, 400) and len(problems) == 1 and "big.bin (30000 B)" in problems[0]
    out = add_workdir(NodeOutputs(1, "s3://out/runs/r1/node-1", COMPLETE, 3, 30), files, nbytes, problems)
    assert out.verdict == PARTIAL and "working folder: 1 file(s) over the 20.0 KB limit" in out.detail
    # some files failed to upload (the transfer program's exit code 3 and its list)
    files, _, problems = workdir_pushed(where, "node 1 (h)", 3, json.dumps(
        {"files": 1, "bytes": 100, "failed": ["ckpt/b.pt: AccessDenied"]}), picked, 1.0, None)
    assert files == 1 and any("1 file(s) not uploaded: ckpt/b.pt: AccessDenied" in p for p in problems)
    # choosing the files failed (no Python on the node, a crash): nothing counted, the reason named
    files, nbytes, problems = workdir_pushed(where, "node 1 (h)", 9, "", "sh: 1: python3: not found\n", 0.1, None)
    assert (files, nbytes) == (0, 0) and problems == [
        "node 1 (h): choosing what to upload failed (exit code 9): sh: 1: python3: not found"]
