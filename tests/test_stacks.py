"""`pulumi up -s aws-g5` / `-s gcp-v100` from a clone, under Pulumi's mock runtime: stacks/__main__.py
runs with each example stack's config handed over as the Pulumi CLI hands it to a Python program.

How the CLI hands config over (the behaviour modelled): the language host sets PULUMI_CONFIG to a
JSON object of "namespace:key" -> value, every value a string (objects and lists as JSON text,
booleans as "true"/"false"), which pulumi.runtime.config reads (pulumi SDK,
pulumi/runtime/config.py, `get_config_env`); the stack name is the one given with -s.
The caller's public address comes from checkip.amazonaws.com (one IPv4 and a newline,
https://checkip.amazonaws.com), served here on loopback; unreachable, the update must stop.
"""

from __future__ import annotations

import http.server
import json
import re
import runpy
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("pulumi_aws")
pytest.importorskip("pulumi_gcp")
yaml = pytest.importorskip("yaml")

from gpucluster.errors import SpecError  # noqa: E402
from gpucluster.infra.aws import mock_runtime  # noqa: E402
from gpucluster.infra.aws.mock_runtime import build  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "stacks" / "__main__.py"
CALLER = "198.51.100.23"


def as_pulumi_hands_it(stack: str) -> str:
    doc = yaml.safe_load((ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text())
    def text(v):
        if isinstance(v, (dict, list)):
            return json.dumps(v)
        return str(v).lower() if isinstance(v, bool) else str(v)
    return json.dumps({k: text(v) for k, v in doc["config"].items()})


@pytest.fixture
def checkip(monkeypatch):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.end_headers()
            self.wfile.write(f"{CALLER}\n".encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("GPUCLUSTER_CHECKIP_URL", f"http://127.0.0.1:{server.server_address[1]}/")
    yield
    server.shutdown()
    server.server_close()


def pulumi_up(stack: str, monkeypatch):
    monkeypatch.setenv("PULUMI_CONFIG", as_pulumi_hands_it(stack))
    monkeypatch.chdir(ROOT)
    return build(program=lambda: runpy.run_path(str(MAIN), run_name="__main__") and None, stack=stack)


def test_aws_example_stack_declares_two_g5_nodes_reachable_from_the_caller(checkip, monkeypatch):
    built = pulumi_up("aws-g5", monkeypatch)
    assert built.error is None, built.error
    fleet = built.recorder.fleet()  # all nodes in one instant EC2 Fleet
    assert fleet.inputs["targetCapacitySpecification"]["totalTargetCapacity"] == 2
    assert fleet.inputs["launchTemplateConfigs"][0]["overrides"][0]["instanceType"] == "g5.xlarge"
    ssh = [r for r in built.recorder.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
           if r.inputs.get("fromPort") == 22]
    assert [r.inputs["cidrIpv4"] for r in ssh] == [f"{CALLER}/32"]


def test_aws_example_stack_stops_when_the_callers_address_is_unknown(monkeypatch):
    monkeypatch.setenv("GPUCLUSTER_CHECKIP_URL", "http://127.0.0.1:9/")  # nothing listens on port 9
    built = pulumi_up("aws-g5", monkeypatch)
    assert isinstance(built.error, SpecError) and "public IPv4" in built.error.message
    assert built.recorder.resources == []  # nothing declared: never a cluster nobody can reach


class GkeRecorder(mock_runtime.Recorder):
    """The recorder plus what GKE returns for a new cluster (its endpoint and CA certificate,
    outputs the provider reads back after create; the same fake as tests/test_gcp_infra.py)."""

    def new_resource(self, args):
        rid, state = super().new_resource(args)
        if args.typ == "gcp:container/cluster:Cluster":
            state.update(endpoint="203.0.113.10", masterAuth={"clusterCaCertificate": "LS0tQ0EtLS0="})
        return [rid, state]


def test_gcp_example_stack_declares_the_v100_pool(monkeypatch):
    monkeypatch.setattr(mock_runtime, "Recorder", GkeRecorder)
    built = pulumi_up("gcp-v100", monkeypatch)
    assert built.error is None, built.error
    pools = built.recorder.of_type("gcp:container/nodePool:NodePool")
    gpu = [p.inputs for p in pools if p.inputs.get("nodeConfig", {}).get("guestAccelerators")]
    assert len(gpu) == 1 and gpu[0]["nodeCount"] == 2
    (acc,) = gpu[0]["nodeConfig"]["guestAccelerators"]
    assert (acc["type"], acc["count"]) == ("nvidia-tesla-v100", 4)
    assert gpu[0]["nodeConfig"]["machineType"] == "n1-standard-16"
    (cluster,) = built.recorder.of_type("gcp:container/cluster:Cluster")
    assert cluster.inputs["location"] == "us-central1-a"


def test_the_example_stacks_are_clean_and_need_no_edit_to_be_reachable():
    aws = yaml.safe_load((ROOT / "stacks" / "Pulumi.aws-g5.yaml").read_text())
    assert "gpucluster:sshCidr" not in aws["config"]  # detected at `pulumi up`, no placeholder
    for stack in ("aws-g5", "gcp-v100"):
        assert "encryptionsalt" not in yaml.safe_load((ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text())


def test_pulumi_install_finds_the_requirements_where_the_language_host_reads_them():
    """`pulumi install` (and `pulumi up` on a missing .venv) runs the Python language host's pip
    toolchain with the *program* folder: requirements.txt is read from there and pip runs there
    (pulumi/pulumi sdk/python/toolchain/pip.go `InstallDependencies`: "If requirements.txt doesn't
    exist, exit early", with `pipCmd.Dir = cwd`), while the virtualenv path is joined to the project
    root (`resolveVirtualEnvironmentPath(root, virtualenv)`). The program folder is `main` when
    `main` is a folder (pkg/engine `getPwdMain`: `pwd = main`)."""
    project = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    program_dir = (ROOT / project.get("main", ".")).resolve()
    assert program_dir.is_dir()
    req = program_dir / "requirements.txt"
    assert req.is_file(), f"no requirements.txt in {program_dir}: `pulumi install` would install nothing"
    lines = [ln.strip() for ln in req.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    (edit,) = [ln for ln in lines if ln.startswith("-e ")]
    target, extras = re.fullmatch(r"-e (\S+?)\[([a-z,]+)\]", edit).groups()
    # pip runs in the program folder, so the editable path is resolved from there.
    assert (program_dir / target).resolve() == ROOT
    assert 'name = "gpucluster"' in (ROOT / "pyproject.toml").read_text()
    assert set(extras.split(",")) == {"aws", "gcp"}
    # the virtualenv lands at the root (where `make install` puts the same .venv)
    assert project["runtime"]["options"]["virtualenv"] == ".venv"
    assert not (ROOT / "requirements.txt").exists(), "a root requirements.txt is never read by `pulumi install`"
