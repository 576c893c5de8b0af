"""Lifecycle rules that need no processes: a busy cluster is left alone, bugs still tear down."""

import pytest

from gpucluster.infra.registry import plugin as backend_of
from gpucluster.domain import Provider
from gpucluster.errors import ClusterBusy, ExitCode
from gpucluster.watch.launch import JobSpec, Launcher
from gpucluster.ledger.store import Ledger
from gpucluster.lifecycle.steps import execute
from gpucluster.spec import ClusterSpec

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


class BusyProvider(Provider):
    cloud = "aws"

    def __init__(self):
        self.calls = []

    def up(self, spec, events):
        self.calls.append("up")
        raise ClusterBusy("cluster 'c1' is in use by gpucluster process 4242 (run r-other)")

    def down(self, name, events):
        self.calls.append("down")

    def leftovers(self, name, run_id=None):
        self.calls.append("leftovers")
        return []


class NeverLaunched(Launcher):
    def launch(self, *a, **kw):
        raise AssertionError("must not launch")


def test_busy_cluster_is_neither_torn_down_nor_swept(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path / "home"))
    ledger = Ledger(tmp_path / "l.db")
    provider = BusyProvider()
    spec = ClusterSpec(cloud="aws", nodes=2, name="c1", region="us-east-1", instance_type="g5.xlarge",
                       ssh_cidr="203.0.113.7/32", run_id="r1")
    out = execute(spec, JobSpec(run_id="r1", workload="digits"), backend=backend_of(spec.cloud),
                  ledger=ledger, provider=provider,
                  launcher=NeverLaunched())
    assert provider.calls == ["up"]  # no down, no delete-by-tag from under the owner
    assert out.status == "failed" and out.exit_code == ExitCode.FAILURE and out.teardown_verified is None
    run = ledger.get_run("r1").to_dict()
    assert "in use by gpucluster process 4242" in run["failure"]
    teardown = next(p for p in run["phases"] if p["name"] == "teardown")
    assert teardown["status"] == "ok" and "another live gpucluster run" in teardown["detail"]


def test_report_says_why_teardown_was_skipped(tmp_path, monkeypatch):
    from rich.console import Console

    from gpucluster.cli.render import run_report

    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path / "home"))
    ledger = Ledger(tmp_path / "l.db")
    spec = ClusterSpec(cloud="aws", nodes=2, name="c1", region="us-east-1", instance_type="g5.xlarge",
                       ssh_cidr="203.0.113.7/32", run_id="r2")
    execute(spec, JobSpec(run_id="r2", workload="digits"), backend=backend_of(spec.cloud),
            ledger=ledger, provider=BusyProvider(),
            launcher=NeverLaunched())
    con = Console(record=True, width=200)
    run_report(con, ledger.get_run("r2"))
    text = con.export_text()
    assert "teardown: nothing created: the cluster belongs to another live gpucluster run" in text
    assert "NOT VERIFIED" not in text and "--keep" not in text


class FailingDestroyProvider(Provider):
    """A cloud whose delete fails while its tag sweep finds nothing (issue 10 item 4): resources
    the failed `pulumi destroy` left may carry no tag, so the clean sweep proves nothing."""

    cloud = "aws"

    def up(self, spec, events):
        from gpucluster.errors import ProvisionError

        raise ProvisionError("injected: create failed")

    def down(self, name, events):
        from gpucluster.errors import TeardownIncomplete

        raise TeardownIncomplete("pulumi destroy failed: DependencyViolation")

    def leftovers(self, name, run_id=None):
        return []


def test_failed_cloud_delete_is_never_verified_by_a_clean_sweep(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path / "home"))
    ledger = Ledger(tmp_path / "l.db")
    spec = ClusterSpec(cloud="aws", nodes=2, name="c1", region="us-east-1", instance_type="g5.xlarge",
                       ssh_cidr="203.0.113.7/32", run_id="r3")
    out = execute(spec, JobSpec(run_id="r3", workload="digits"), backend=backend_of(spec.cloud),
                  ledger=ledger, provider=FailingDestroyProvider(),
                  launcher=NeverLaunched())
    assert out.exit_code == ExitCode.LEFTOVERS and not out.teardown_verified
    run = ledger.get_run("r3").to_dict()
    assert run["teardown"] == "not verified"
    assert any("DependencyViolation" in u for u in run["unchecked"])


def test_region_is_resolved_before_anything_reads_it():
    # issue 10 item 3: without --region the cluster, the ledger and the sweep all use one region
    from specs import resolve

    bare = ClusterSpec(cloud="aws", nodes=1, name="c1", instance_type="g5.xlarge", ssh_cidr="203.0.113.7/32")
    assert bare.region is None
    assert resolve(bare).region == "us-east-1"
    assert resolve(bare.replace(zone="eu-west-1b")).region == "eu-west-1"
    assert resolve(bare.replace(region="us-west-2")).region == "us-west-2"


def test_phases_are_one_enum_whose_values_the_ledger_keeps():
    # issue 23 item 4: the Phase enum is the one list of phase names; the ledger stores its strings
    import json

    from gpucluster.events import Phase
    from gpucluster.ledger.schema import PHASES

    assert tuple(Phase) == PHASES and all(isinstance(p, str) for p in Phase)
    assert json.dumps([Phase.TRAIN]) == '["train"]' and f"{Phase.SETUP}" == "setup"
class KeptProvider(Provider):
    cloud = "aws"

    def up(self, spec, events):
        from gpucluster.domain import Cluster

        return Cluster(name=spec.name, cloud="aws", nodes=(), gpus_per_node=1)

    def down(self, name, events):
        raise AssertionError("a kept cluster is not destroyed")

    def leftovers(self, name, run_id=None):
        return []


class LeavesObjects(Launcher):
    """Runs fine, but could not delete what it made on the cluster (issue 26: the k8s launcher's
    Job/Service/ConfigMap deletes could fail silently)."""

    cleanup_errors = ["configmap default/gpucluster-r3: (500) Internal Server Error"]

    def launch(self, cluster, job, events, log_dir):
        from gpucluster.watch.launch import JobResult
        from gpucluster.watch.metrics import MetricsState

        return JobResult(ok=True, nodes=[], metrics=MetricsState())


def test_what_the_launcher_could_not_delete_makes_a_kept_clusters_teardown_not_verified(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path / "home"))
    ledger = Ledger(tmp_path / "l.db")
    spec = ClusterSpec(cloud="aws", nodes=1, name="c1", region="us-east-1", instance_type="g5.xlarge",
                       ssh_cidr="203.0.113.7/32", run_id="r3")
    out = execute(spec, JobSpec(run_id="r3", workload="digits"), backend=backend_of(spec.cloud),
                  ledger=ledger, provider=KeptProvider(),
                  launcher=LeavesObjects(), keep=True)
    assert out.teardown == "not verified" and out.exit_code == ExitCode.LEFTOVERS
    assert any("could not delete configmap default/gpucluster-r3" in u for u in out.unchecked)


# -- issue 32: a sweep carries each run's verdict and record error; `up` never exits 2 once made --
class MadeCluster(Provider):
    """A cloud whose create succeeds at once and whose delete and tag sweep find nothing."""

    cloud = "aws"

    def up(self, spec, events):
        from gpucluster.domain import Cluster

        return Cluster(name=spec.name, cloud="aws", nodes=(), gpus_per_node=1)

    def down(self, name, events):
        pass

    def leftovers(self, name, run_id=None):
        return []


class Unwitnessed(Launcher):
    """The job ran, but a node's reaper was killed: nothing vouches that the node left nothing."""

    def launch(self, cluster, job, events, log_dir):
        from gpucluster.domain import UNWITNESSED
        from gpucluster.watch.launch import JobResult
        from gpucluster.watch.metrics import MetricsState

        return JobResult(ok=True, nodes=[], metrics=MetricsState(),
                         unwitnessed=[UNWITNESSED + "node 0 (h0): its reaper ended without finishing its final pass"])


class FullOnFinish(Ledger):
    """The real ledger, on a disk that fills as the first run's row is closed (every write after
    that fails as SQLite's SQLITE_FULL does, through the ledger's own error)."""

    full = False

    def finish_run(self, run_id, **kw):
        from gpucluster.ledger.store import LedgerError

        if self.full or kw.get("status") is not None:
            self.full = True
            raise LedgerError("could not write the ledger: database or disk is full")
        return super().finish_run(run_id, **kw)

    def create_run(self, *a, **kw):
        from gpucluster.ledger.store import LedgerError

        if self.full:
            raise LedgerError("could not write the ledger: database or disk is full")
        return super().create_run(*a, **kw)


def _aws_spec(run_id=None):
    return ClusterSpec(cloud="aws", nodes=1, name="c1", region="us-east-1", instance_type="g5.xlarge",
                       ssh_cidr="203.0.113.7/32", run_id=run_id)


def test_a_sweep_whose_runs_were_not_verified_says_so_for_each(tmp_path, monkeypatch):
    from gpucluster.infra.registry import plugin
    from gpucluster.sweep.runner import run_sweep

    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path / "home"))
    ledger = Ledger(tmp_path / "l.db")
    sweep = run_sweep(_aws_spec(), JobSpec(run_id="t", workload="digits"), [1, 2], [None], 1, ledger,
                      (MadeCluster(), Unwitnessed()), plugin=plugin("aws"))
    assert [r.status for r in sweep.runs] == ["succeeded", "succeeded"]  # the jobs themselves went fine
    assert [(r.exit_code, r.teardown) for r in sweep.runs] == [(3, "not verified")] * 2
    assert len(sweep.doubts) == 2 and all("teardown NOT VERIFIED" in d and "gpucluster down c1" in d
                                          for d in sweep.doubts), sweep.doubts


def test_a_sweep_stops_when_its_record_cannot_be_written(tmp_path, monkeypatch):
    """The first run's row cannot be closed (a full home): that run still tears down and checks
    (verified), the sweep does not start the next size (it could not be recorded), and says why."""
    from gpucluster.infra.registry import plugin
    from gpucluster.sweep.runner import run_sweep

    class Fine(Launcher):
        def launch(self, cluster, job, events, log_dir):
            from gpucluster.watch.launch import JobResult
            from gpucluster.watch.metrics import MetricsState

            return JobResult(ok=True, nodes=[], metrics=MetricsState())

    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path / "home"))
    ledger = FullOnFinish(tmp_path / "l.db")
    sweep = run_sweep(_aws_spec(), JobSpec(run_id="t", workload="digits"), [1, 2, 4], [None], 1, ledger,
                      (MadeCluster(), Fine()), plugin=plugin("aws"))
    assert len(sweep.runs) == 1 and sweep.record_error and "disk is full" in sweep.record_error
    (run,) = sweep.runs
    assert run.teardown == "verified" and run.exit_code == ExitCode.LEFTOVERS and run.record_error
    assert len(sweep.doubts) == 1 and "record could not be written" in sweep.doubts[0], sweep.doubts


def test_up_whose_record_cannot_be_written_keeps_the_cluster_and_says_so(tmp_path, monkeypatch):
    """`up` made the cluster, then the ledger could not take the success (a full home): the
    cluster is kept (as asked, and it bills), and the record error comes back for exit 3 (it
    raised LedgerError before: exit 2, "bad input, nothing was started", with a cluster up)."""
    from gpucluster.lifecycle.steps import provision_only

    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path / "home"))

    class NoDown(MadeCluster):
        def down(self, name, events):
            raise AssertionError("a cluster `up` made is kept")

    made = provision_only(_aws_spec("r-up"), backend=backend_of("aws"), ledger=FullOnFinish(tmp_path / "l.db"),
                          provider=NoDown())
    assert made.cluster.name == "c1" and "disk is full" in made.record_error


class LeavesRowsOpen(LeavesObjects):
    """A GKE job's launcher: its Kubernetes objects are ledger rows (written before each create), and
    its deletes failed, so their rows are still open when the run's cluster is destroyed."""

    def launch(self, cluster, job, events, log_dir):
        for kind, name in (("k8s-configmap", "default/gpucluster-r4"), ("k8s-job", "default/gpucluster-r4")):
            events.resource_requested(kind, name)
            events.resource_created(kind, name)
        return super().launch(cluster, job, events, log_dir)


def test_a_verified_teardown_of_the_cluster_closes_the_launchers_open_rows(tmp_path, monkeypatch):
    """The launcher could not delete its objects, but the cluster they lived on was destroyed and the
    check found nothing: the rows close with it (confirmed gone), the failed deletes are still said,
    and nothing of the run stays open in the ledger (which `status` and `down` read)."""
    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path / "home"))
    ledger = Ledger(tmp_path / "l.db")
    spec = ClusterSpec(cloud="aws", nodes=1, name="c4", region="us-east-1", instance_type="g5.xlarge",
                       ssh_cidr="203.0.113.7/32", run_id="r4")
    out = execute(spec, JobSpec(run_id="r4", workload="digits"), backend=backend_of(spec.cloud),
                  ledger=ledger, provider=MadeCluster(), launcher=LeavesRowsOpen())
    assert out.teardown == "verified", (out.teardown, out.unchecked)
    assert "the launcher could not delete configmap default/gpucluster-r3" in (out.failure or "")
    rows = {(r.kind, r.name): r.confirmed_gone for r in ledger.get_run("r4").resources}
    assert rows[("k8s-job", "default/gpucluster-r4")] and rows[("k8s-configmap", "default/gpucluster-r4")], rows
    assert [r for r in ledger.open_resources("c4")] == []
