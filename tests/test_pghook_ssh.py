"""Whether a rank joined a process group (issue 46 item 2) on two real sshd hosts on loopback: the hook
goes in the job bundle (`pghook/sitecustomize.py` in each node folder), a script that exits 0 without
joining a group is SUCCEEDED with the warning, and nothing of the run (the hook included) is left on
the hosts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import needs_torch, run_cli  # noqa: E402
from gpucluster.ledger.store import Ledger  # noqa: E402
from pg_scripts import check_no_group, scripts  # noqa: E402
from script_shapes import nothing_on_hosts  # noqa: E402
from sshd import hosts, skip_unless_usable  # noqa: E402,F401

skip_unless_usable()
pytestmark = [pytest.mark.sshd, pytest.mark.slow]


@needs_torch
def test_no_rank_joined_is_a_warning_on_ssh(hosts, home, tmp_path):  # noqa: F811 - the fixture
    reach = ("--cloud", "ssh", "--hosts", ",".join(hosts.hosts[:2]), "--identity", str(hosts.identity),
             "--known-hosts", str(hosts.known_hosts), "--remote-python", sys.executable)
    r = run_cli("run", *reach, "--nodes", "2", "--", "python", "no_group.py", cwd=scripts(tmp_path))
    rid = Ledger(home / "ledger.sqlite3").list_runs()[0].id
    check_no_group(r, rid)
    nothing_on_hosts([rid])
