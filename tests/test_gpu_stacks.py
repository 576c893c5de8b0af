"""Issue 42: the example stacks for a current GPU per cloud (stacks/Pulumi.aws-h100.yaml,
stacks/Pulumi.gcp-l4.yaml) run as `pulumi up -s STACK` runs them (stacks/__main__.py under Pulumi's
mock runtime, the config handed over as the Pulumi CLI hands it: tests/test_stacks.py's helpers)."""

from __future__ import annotations

import pytest

pytest.importorskip("pulumi_aws")
pytest.importorskip("pulumi_gcp")

from test_stacks import CALLER, GkeRecorder, checkip, pulumi_up  # noqa: E402,F401 - checkip: a fixture

from gpucluster.infra.aws import mock_runtime  # noqa: E402

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def test_aws_h100_stack_declares_two_p5_nodes_with_efa(checkip, monkeypatch):  # noqa: F811
    built = pulumi_up("aws-h100", monkeypatch)
    assert built.error is None, built.error
    fleet, lt = built.recorder.fleet(), built.recorder.node_template()
    assert fleet.inputs["targetCapacitySpecification"]["totalTargetCapacity"] == 2
    assert fleet.inputs["launchTemplateConfigs"][0]["overrides"][0]["instanceType"] == "p5.48xlarge"
    assert lt.inputs["networkInterfaces"][0]["interfaceType"] == "efa"


def test_gcp_l4_stack_declares_the_g2_pool(monkeypatch):
    monkeypatch.setattr(mock_runtime, "Recorder", GkeRecorder)
    built = pulumi_up("gcp-l4", monkeypatch)
    assert built.error is None, built.error
    pools = built.recorder.of_type("gcp:container/nodePool:NodePool")
    (gpu,) = [p.inputs for p in pools if p.inputs.get("nodeConfig", {}).get("guestAccelerators")]
    assert gpu["nodeConfig"]["machineType"] == "g2-standard-4" and gpu["nodeConfig"]["gvnic"] == {"enabled": True}
    assert [(a["type"], a["count"]) for a in gpu["nodeConfig"]["guestAccelerators"]] == [("nvidia-l4", 1)]
