"""Lifecycle rules that need no processes: a busy cluster is left alone, bugs still tear down."""

from gpucluster.domain import Provider
from gpucluster.errors import ClusterBusy, ExitCode
from gpucluster.launch import JobSpec, Launcher
from gpucluster.ledger import Ledger
from gpucluster.lifecycle import execute
from gpucluster.spec import ClusterSpec


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
    out = execute(spec, JobSpec(run_id="r1", workload="digits"), ledger=ledger, provider=provider,
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
    execute(spec, JobSpec(run_id="r2", workload="digits"), ledger=ledger, provider=BusyProvider(),
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
    out = execute(spec, JobSpec(run_id="r3", workload="digits"), ledger=ledger, provider=FailingDestroyProvider(),
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
    from gpucluster.ledger_schema import PHASES

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
        from gpucluster.launch import JobResult
        from gpucluster.metrics import MetricsState

        return JobResult(ok=True, nodes=[], metrics=MetricsState())


def test_what_the_launcher_could_not_delete_makes_a_kept_clusters_teardown_not_verified(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path / "home"))
    ledger = Ledger(tmp_path / "l.db")
    spec = ClusterSpec(cloud="aws", nodes=1, name="c1", region="us-east-1", instance_type="g5.xlarge",
                       ssh_cidr="203.0.113.7/32", run_id="r3")
    out = execute(spec, JobSpec(run_id="r3", workload="digits"), ledger=ledger, provider=KeptProvider(),
                  launcher=LeavesObjects(), keep=True)
    assert out.teardown == "not verified" and out.exit_code == ExitCode.LEFTOVERS
    assert any("could not delete configmap default/gpucluster-r3" in u for u in out.unchecked)
