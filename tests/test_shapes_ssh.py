"""Issue 46 done-means 3 on two real sshd hosts on loopback: three public script shapes run
unmodified through `gpucluster run --cloud ssh` (tests/script_shapes.py says which and what is
asserted), and nothing of any run is left on the hosts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import needs_torch  # noqa: E402
from script_shapes import check_hydra, check_lightning, check_nanogpt, nothing_on_hosts, project  # noqa: E402
from sshd import hosts, skip_unless_usable  # noqa: E402,F401

skip_unless_usable()
pytestmark = [pytest.mark.sshd, pytest.mark.slow]


@needs_torch
@pytest.mark.parametrize("shape,check", [("lightning_cli", check_lightning), ("hydra_app", check_hydra),
                                         ("nanogpt", check_nanogpt)])
def test_shape_runs_unmodified_on_ssh(hosts, home, tmp_path, shape, check):  # noqa: F811 - the fixture
    reach = ("--cloud", "ssh", "--hosts", ",".join(hosts.hosts[:2]), "--identity", str(hosts.identity),
             "--known-hosts", str(hosts.known_hosts), "--remote-python", sys.executable)
    from gpucluster.ledger.store import Ledger

    check(home, project(tmp_path, shape), reach)
    nothing_on_hosts([r.id for r in Ledger(home / "ledger.sqlite3").list_runs()])
