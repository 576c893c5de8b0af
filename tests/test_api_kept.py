"""Issue 47, item 4: the Python API's kept cluster end to end, `gpucluster.up(...)` -> `Cluster.exec(...)`
-> `Cluster.status()` -> `Cluster.down()`, on the stand-in cloud of tests/test_kept.py (the fake Pulumi
CLI, two real sshd "instances" on 127.0.0.6/7): local and ssh clusters have no `up`, so a kept
cluster needs a cloud gpucluster creates. Run in a subprocess, as a user's script would be."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from test_kept import HERE, cloud  # noqa: F401 - the fixture

pytestmark = [pytest.mark.slow, pytest.mark.sshd]



def test_up_exec_status_down_through_the_api(cloud, tmp_path):  # noqa: F811 - the fixture
    proc = subprocess.run([sys.executable, str(HERE / "fixtures" / "api_kept.py"), str(HERE)], capture_output=True,
                          text=True, env=cloud.env(), cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["name"] == "kept" and got["nodes"] == 2 and got["up"] is True
    assert got["status"] == "succeeded" and got["teardown"] == "kept", got["failure"]
    assert [line for line in got["logs"] if line.startswith("on ")] == ["on node0", "on node1"], got["logs"]
    assert got["refused"] and "unknown keyword 'nodes'" in got["refused"]
    assert got["verdict"] == "verified" and got["exit"] == 0 and got["after"] is False
