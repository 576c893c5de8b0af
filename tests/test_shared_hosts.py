"""Two users on ONE machine and on the SAME ssh hosts (same remote account): one user's `down`,
run teardown or stray-process cleanup never stops the other's processes or removes the other's
run folders. Real processes: `gpucluster run` through the CLI in two homes, real torchrun, real
OpenSSH servers on loopback (tests/sshd.py; every "host" is this machine, so /proc sees them).

Each home has its own installation id; every process of a run carries it (GPUCLUSTER_OWNER) with
the run id, and each ssh run folder carries an owner mark. To show the owner (not only the
random run id) protects the other user, bob's ledger is also given rows for alice's run id, as
a copied home or a restored backup would hold them: his `down` must still leave her run alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import ROOT, gpucluster_argv, needs_torch  # noqa: E402
from sshd import hosts, run_processes, skip_unless_usable  # noqa: E402,F401
from test_reaper import daemons, marked, new_marker  # noqa: E402
from test_ssh_down import project, remote_run_dir, ssh_args  # noqa: E402

from gpucluster.ledger.store import Ledger  # noqa: E402

pytestmark = [needs_torch, pytest.mark.slow]
SLEEP = ["--", "python", "-c", "import time; time.sleep(300)"]


class User:
    def __init__(self, name: str, home: Path):
        self.name, self.home = name, home
        self.env = dict(os.environ, GPUCLUSTER_HOME=str(home), LOGNAME=name, USER=name, COLUMNS="200")

    def cli(self, *args: str, cwd=ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(gpucluster_argv(*args), capture_output=True, text=True, env=self.env, cwd=cwd,
                              timeout=timeout)

    def start(self, *args: str, cwd=ROOT) -> subprocess.Popen:
        return subprocess.Popen(gpucluster_argv(*args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=self.env, cwd=cwd, start_new_session=True)

    def ledger(self) -> Ledger:
        return Ledger(self.home / "ledger.sqlite3")

    def only_run(self) -> dict:
        (run,) = self.ledger().list_runs()
        return self.ledger().get_run(run.id).to_dict()


@pytest.fixture
def users(tmp_path):
    return User("alice", tmp_path / "alice"), User("bob", tmp_path / "bob")


def wait_for(what, check, proc, timeout=120.0):
    end = time.monotonic() + timeout
    while not check():
        assert proc.poll() is None, f"alice's run ended early ({proc.returncode}) while waiting for {what}"
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.2)


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: her own teardown runs
    try:
        return proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def forge(ledger: Ledger, run: dict, kinds: tuple[str, ...]) -> None:
    """Give a ledger the row (and resource rows) of someone else's run: a run id in common."""
    ledger.create_run(run["id"], cloud=run["cloud"], cluster=run["cluster"], nodes=run["nodes"],
                      gpus_per_node=run["gpus_per_node"], command=run["command"], spec=run["spec"])
    for r in run["resources"]:
        if r["kind"] in kinds:
            ledger.resource_requested(run["id"], r["kind"], r["name"], detail=r["detail"])
            ledger.resource_created(run["id"], r["kind"], r["name"], r["cloud_id"])


def test_two_homes_on_one_machine_never_stop_each_others_processes(users):
    alice, bob = users
    proc = alice.start("run", "--cloud", "local", "--nodes", "2", "--name", "lab", *SLEEP)
    try:
        wait_for("alice's row", lambda: alice.home.joinpath("ledger.sqlite3").exists() and alice.ledger().list_runs(),
                 proc)
        run_id = alice.ledger().list_runs()[0].id
        wait_for("alice's agents and workers", lambda: len(run_processes(run_id)) >= 4, proc)
        mine = set(run_processes(run_id))
        envs = [Path(f"/proc/{p}/environ").read_bytes().split(b"\0") for p in mine if Path(f"/proc/{p}").exists()]
        alice_id = (alice.home / "installation-id").read_text().strip()
        assert any(f"GPUCLUSTER_OWNER={alice_id}".encode() in e for e in envs)

        # bob's down of the same name: his ledger has no such cluster (exit 2), nothing of hers is touched
        r = bob.cli("down", "lab", "--yes", "--json")
        assert r.returncode == 2 and "'lab' is not in the ledger" in r.stderr, r.stdout + r.stderr
        assert mine <= set(run_processes(run_id))
        # bob's own run of the same name, start to teardown, on the same machine
        r = bob.cli("run", "--cloud", "local", "--nodes", "1", "--name", "lab", "--", "python", "-c", "print(1)")
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert bob.only_run()["teardown"] == "verified" and mine <= set(run_processes(run_id))
        # bob's ledger holds alice's run id (a copied home): his down stops by run id AND owner
        forge(bob.ledger(), alice.only_run(), ("process",))
        r = bob.cli("down", "lab", "--yes", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        assert mine <= set(run_processes(run_id)), "bob's down stopped alice's processes"
        assert proc.poll() is None
    finally:
        code = stop(proc)
    assert code == 130
    assert run_processes(run_id) == {}
    run = alice.only_run()
    assert run["status"] == "interrupted" and run["teardown"] == "verified"


@pytest.mark.sshd
def test_two_users_on_the_same_ssh_hosts_never_touch_each_others_runs(users, hosts, tmp_path):
    skip_unless_usable()
    alice, bob = users
    marker = new_marker()
    cwd = project(tmp_path)
    proc = alice.start("run", *ssh_args(hosts, 2), "--name", "lab", "--", "python", "daemon_script.py", marker,
                       "300", cwd=cwd)
    try:
        wait_for("alice's daemons on both hosts", lambda: len(daemons(marker)) >= 2, proc)
        run = alice.only_run()
        run_id = run["id"]
        mine = set(run_processes(run_id))
        folder = remote_run_dir(run_id)
        alice_id = (alice.home / "installation-id").read_text().strip()
        assert (folder / "node-0" / ".gpucluster-owner").read_text().strip() == alice_id

        r = bob.cli("down", "lab", "--yes", "--json")
        assert r.returncode == 2 and "'lab' is not in the ledger" in r.stderr, r.stdout + r.stderr
        r = bob.cli("run", *ssh_args(hosts, 2), "--name", "lab", "--", "python", "-c", "print(1)")
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert bob.only_run()["teardown"] == "verified"
        assert mine <= set(run_processes(run_id)) and folder.is_dir()
        # bob's ledger with alice's run id and her hosts' connection rows: the same remote user, the
        # same run folder path; his down kills by run id AND owner and leaves a folder she marked
        forge(bob.ledger(), alice.only_run(), ("ssh-run",))
        r = bob.cli("down", "lab", "--yes", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        assert mine <= set(run_processes(run_id)), "bob's down stopped alice's processes"
        assert folder.is_dir() and (folder / "node-1").is_dir(), "bob's down removed alice's run folder"
        assert len(daemons(marker)) >= 2 and proc.poll() is None
    finally:
        code = stop(proc)
        for p in marked(marker):
            p.kill()
    assert code == 130
    assert run_processes(run_id) == {} and not folder.exists()
    assert alice.only_run()["teardown"] == "verified"
