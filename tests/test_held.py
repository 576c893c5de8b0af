"""Kept clusters of machines that exist (issue 46 item 8, `gpucluster.lifecycle.held`): `up --cloud local|ssh`
records the machines as `host` rows after one ready check; refusals say what is allowed and record
nothing; `down` of a local kept cluster is verified and closes the rows; the ssh `down` looks for
every run of the cluster on the recorded hosts. In-process: no job runs here (tests/test_held_ssh.py
runs jobs on real sshd hosts)."""

from __future__ import annotations

import sys

import pytest

import gpucluster
from gpucluster.cli import up
from gpucluster.errors import UsageError
from gpucluster.lifecycle.held import HOST_KIND, reach_given
from gpucluster.lifecycle.kept import find
from gpucluster.ledger.store import Ledger

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def invoke(cmd, *args):
    return cmd.main(list(args), prog_name=f"gpucluster {cmd.name}", standalone_mode=False)


def test_up_on_kubernetes_without_a_kubeconfig_is_one_line_and_records_nothing(home, tmp_path, monkeypatch):
    """`up --cloud kubernetes` keeps a namespace of an existing cluster (tests/test_kube_kept.py); without a
    kubeconfig it is refused naming where it looked, before anything is recorded."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    with pytest.raises(Exception) as caught:
        invoke(up.up, "--cloud", "kubernetes", "--name", "lab", "--yes")
    assert f"no kubeconfig at {tmp_path / 'none'}" in str(caught.value)
    assert not (home / "ledger.sqlite3").exists() or Ledger.open_default().list_runs() == []


@pytest.mark.parametrize("flags, named", [
    (("--max-cost", "5"), "--max-cost"),
    (("--idle-minutes", "30"), "--idle-minutes"),
])
def test_what_only_a_created_cluster_has_is_refused_by_name(home, flags, named):
    with pytest.raises(UsageError) as caught:
        invoke(up.up, "--cloud", "local", "--nodes", "2", *flags)
    assert caught.value.message.startswith(f"{named} does not apply to `up --cloud local`")
    assert not (home / "ledger.sqlite3").exists() or Ledger.open_default().list_runs() == []


def test_ssh_up_needs_hosts_and_a_bad_host_is_named(home):
    with pytest.raises(UsageError, match="needs --hosts"):
        invoke(up.up, "--cloud", "ssh")
    with pytest.raises(Exception, match="'bad host!'"):
        invoke(up.up, "--cloud", "ssh", "--hosts", "bad host!")
    assert not (home / "ledger.sqlite3").exists() or Ledger.open_default().list_runs() == []


def test_a_python_without_torch_is_refused_before_anything_is_recorded(home, tmp_path):
    fake = tmp_path / "python-without-torch"
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} -S -I -c 'import sys; sys.exit(3)' \"$@\"\n")
    fake.chmod(0o755)
    with pytest.raises(UsageError, match="has no torch"):
        invoke(up.up, "--cloud", "local", "--nodes", "2", "--python", str(fake), "--name", "lab")
    assert not (home / "ledger.sqlite3").exists() or Ledger.open_default().list_runs() == []


@pytest.mark.integration  # the nodes' Python is started (the ready check): about a second
def test_local_up_records_each_node_then_down_verifies_and_closes_them(home, capsys):
    cluster = gpucluster.up(cloud="local", nodes=2, name="lab", python=sys.executable)
    assert cluster.cloud == "local" and len(cluster.nodes) == 2 and cluster.hourly is None
    ledger = Ledger.open_default()
    rows = [r for r in ledger.open_resources("lab") if r["kind"] == HOST_KIND]
    assert sorted(r["name"] for r in rows) == ["node-0", "node-1"]
    assert all(r["detail"]["python"] == sys.executable for r in rows)  # `exec` runs the same Python
    run = ledger.list_runs()[0]
    assert run.status == "succeeded" and run.teardown == "kept" and run.command == ["gpucluster", "up"]
    kept = find(ledger, "lab")  # what `exec` and `ssh` take: the cluster is up
    assert kept.origin.id == run.id and kept.cloud == "local"
    assert cluster.status()["up"] is True
    with pytest.raises(UsageError, match="kept already"):  # a second `up` of the same name is not a second cluster
        gpucluster.up(cloud="local", nodes=2, name="lab", python=sys.executable)
    # `ssh`: the local launcher cannot connect; it says so once the CLI's own lines are said, as before
    from gpucluster.cli import kept as kept_cli

    with pytest.raises(UsageError, match="^local nodes cannot be reached with `gpucluster ssh`$"):
        invoke(kept_cli.ssh, "lab", "1", "-L", "16006:localhost:6006")
    assert "forwarding 127.0.0.1:16006 -> localhost:6006 on node 1 of lab; Ctrl-C closes it" in capsys.readouterr().err
    result = cluster.down()
    assert result.verdict["verdict"] == "verified" and result.exit_code == 0, result.verdict
    assert result.check is not None and result.check.how == "by run id"  # `down` says "verified by run id"
    assert ledger.open_resources("lab") == []
    assert cluster.status()["up"] is False


def test_reach_is_recorded_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    got = reach_given({"identity": "id_key", "known_hosts": "~/kh", "remote_python": "python3", "python": None})
    assert got["identity"] == str(tmp_path / "id_key") and got["known_hosts"].endswith("/kh")
    assert got["remote_python"] == "python3" and "python" not in got


def test_ssh_down_looks_for_every_run_without_rows_on_the_held_hosts():
    from gpucluster.infra.ssh.held import host_run_rows

    held = [{"kind": HOST_KIND, "cluster": "lab", "detail": {"rank": r, "host": "10.0.0.5", "user": "u", "port": 22 + r,
                                                             "home": "/home/u", "identity": "/k"}} for r in (0, 1)]
    rows = host_run_rows(held, ["r-up", "r-killed"], "~/.gpucluster/runs")
    assert [(r["run_id"], r["cloud_id"]) for r in rows] == [
        ("r-up", "/home/u/.gpucluster/runs/r-up/node-0"), ("r-up", "/home/u/.gpucluster/runs/r-up/node-1"),
        ("r-killed", "/home/u/.gpucluster/runs/r-killed/node-0"),
        ("r-killed", "/home/u/.gpucluster/runs/r-killed/node-1")]
    assert all(r["kind"] == "ssh-run" and r["detail"]["python"] == "python3" for r in rows)


def test_run_keep_on_machines_that_exist_points_to_up(home):
    from gpucluster.cli.args import refuse_flags

    with pytest.raises(UsageError) as caught:
        refuse_flags("ssh", {"keep": (("--keep",), True)})
    assert "--keep does not apply to --cloud ssh" in caught.value.message
    assert caught.value.message.endswith("gpucluster up --cloud ssh ... --name NAME")


def test_a_kept_cluster_is_said_in_its_providers_words():
    """`up`/`exec` say what a kept cluster is and what `down` never touches from the Cluster its provider
    built: machines that exist by default (local, ssh), a namespace where the provider says so (kubernetes)."""
    from gpucluster.domain import Cluster
    from gpucluster.infra.registry import plugin
    from gpucluster.lifecycle.held import kept_said
    from gpucluster.spec import ClusterSpec

    spec = ClusterSpec(cloud="local", nodes=2, name="lab")
    assert kept_said(plugin("local"), spec, Cluster("lab", "local", ())) == ("machines that exist, $0 here",
                                                                            "the machines")
    kube = ClusterSpec(cloud="kubernetes", nodes=2, name="lab")
    from gpucluster.infra.kube.provider import KubeProvider

    cluster = KubeProvider().up(kube, _NoEvents())
    assert kept_said(plugin("kubernetes"), kube, cluster) == (
        "a namespace of an existing Kubernetes cluster, $0 here", "the namespace, the cluster or its nodes")


class _NoEvents:
    def resource_requested(self, kind, name, **detail): ...
    def resource_created(self, kind, name, cloud_id=None, **detail): ...
    def resource_deleted(self, kind, name, cloud_id=None): ...
    def message(self, text): ...


def test_the_check_says_how_it_looked(home):
    """`down` says "verified by tag" / "by run id" / "by run label" from the Check the backend returned:
    the way it looked travels with the check through `+` and `with_unchecked`."""
    from gpucluster.domain import Check, Leftover
    from gpucluster.infra.kube.plugin import check_down as kube_down
    from gpucluster.infra.local.plugin import check_down as local_down
    from gpucluster.infra.ssh.plugin import check_down as ssh_down
    from gpucluster.infra.local.provider import LocalProvider

    assert Check.of([]).how == "by tag" and Check().how == "by tag"
    by_id = Check.of([Leftover("process", "1")], how="by run id")
    assert (by_id + Check()).how == "by run id" and by_id.with_unchecked("x").how == "by run id"
    assert Check.of(by_id).how == "by run id" and Check.of(by_id, how="by run label").how == "by run label"
    assert by_id == Check((Leftover("process", "1"),))  # how it looked is no part of what was found
    assert local_down(LocalProvider(), "lab", {}).how == "by run id"
    assert ssh_down(LocalProvider(), "lab", {}).how == "by run id"
    assert kube_down(LocalProvider(), "lab", {}).how == "by run label"


def test_what_a_verified_teardown_rests_on_follows_from_how_the_backend_finds_its_resources():
    """`show`'s "teardown: verified (...)": a tag scan for the clouds gpucluster creates machines on, and for a
    cloud the registry does not know (as before); the run's own marks for machines that exist (no per-backend
    words in the contract: `Traits.verified_detail` is gone)."""
    from gpucluster.cli.render import RUN_MARKS, TAG_SCAN, _verified_detail

    assert _verified_detail("aws") == _verified_detail("gcp") == TAG_SCAN == "every check by tag found nothing"
    assert _verified_detail("local") == _verified_detail("ssh") == _verified_detail("kubernetes") == RUN_MARKS
    assert _verified_detail(None) == _verified_detail("nowhere") == TAG_SCAN
