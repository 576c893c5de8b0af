"""The g5 catalog and AWS spec validation (no Pulumi needed)."""

from __future__ import annotations

import pytest

from gpucluster.infra.aws import catalog
from gpucluster.errors import SpecError
from gpucluster.spec import ClusterSpec
from specs import validate

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def aws_spec(**kw) -> ClusterSpec:
    base = dict(
        cloud="aws",
        nodes=2,
        name="demo",
        region="us-east-1",
        instance_type="g5.xlarge",
        ssh_cidr="203.0.113.7/32",
    )
    base.update(kw)
    if isinstance(base.get("options"), dict):
        base["options"] = tuple(sorted(base["options"].items()))
    return ClusterSpec(**base)


# (gpus, vcpus, ram GiB, efa) per FACTS.md (SkyPilot catalog v8 / moto 5.2.5 instance data)
FACTS = {
    "g5.xlarge": (1, 4, 16, False),
    "g5.2xlarge": (1, 8, 32, False),
    "g5.4xlarge": (1, 16, 64, False),
    "g5.8xlarge": (1, 32, 128, True),
    "g5.12xlarge": (4, 48, 192, True),
    "g5.16xlarge": (1, 64, 256, True),
    "g5.24xlarge": (4, 96, 384, True),
    "g5.48xlarge": (8, 192, 768, True),
}


# issue 42: the current GPU families (moto 5.2.5 DescribeInstanceTypes; FACTS.md, gathered 2026-11-28)
GPU_FACTS = {  # type: (gpu, gpus, MiB per GPU, vcpus, GiB, most EFA interfaces, quota class)
    "g6.xlarge": ("L4", 1, 22888, 4, 16, 0, "G"),
    "g6.48xlarge": ("L4", 8, 22888, 192, 768, 1, "G"),
    "g6e.xlarge": ("L40S", 1, 45776, 4, 32, 0, "G"),
    "g6e.48xlarge": ("L40S", 8, 45776, 192, 1536, 4, "G"),
    "p4d.24xlarge": ("A100", 8, 40960, 96, 1152, 4, "P"),
    "p4de.24xlarge": ("A100-80GB", 8, 81920, 96, 1152, 4, "P"),
    "p5.4xlarge": ("H100", 1, 81920, 16, 256, 1, "P"),
    "p5.48xlarge": ("H100", 8, 81920, 192, 2048, 32, "P"),
    "p5e.48xlarge": ("H200", 8, 144384, 192, 2048, 32, "P"),
    "p5en.48xlarge": ("H200", 8, 144384, 192, 2048, 16, "P"),
    "p6-b200.48xlarge": ("B200", 8, 183359, 192, 2048, 8, "P"),
}


def test_catalog_has_every_gpu_family_with_the_sourced_specs_and_zones():
    assert set(GPU_FACTS) <= set(catalog.INSTANCE_TYPES)
    assert {t.family for t in catalog.INSTANCE_TYPES.values()} == {
        "g5", "g6", "g6e", "p4d", "p4de", "p5", "p5e", "p5en", "p6-b200"}
    for name, (gpu, n, mib, vcpus, gib, efa, klass) in GPU_FACTS.items():
        t = catalog.INSTANCE_TYPES[name]
        assert (t.gpu_model, t.gpus, t.gpu_memory_mib, t.vcpus, t.memory_gib, t.efa_interfaces, t.quota_class) == (
            gpu, n, mib, vcpus, gib, efa, klass), name
    p5 = catalog.INSTANCE_TYPES["p5.48xlarge"]
    assert p5.zones_in("us-east-1") == tuple(f"us-east-1{z}" for z in "abcdef") and p5.efa_default
    assert catalog.INSTANCE_TYPES["p5e.48xlarge"].zones_in("us-east-1") == ()  # p5e: us-east-2, us-west-2, ...
    assert not catalog.INSTANCE_TYPES["g6.48xlarge"].efa_default  # EFA on by default only where made for it


def test_catalog_has_the_eight_g5_sizes_with_the_sourced_specs():
    assert set(FACTS) <= set(catalog.INSTANCE_TYPES)
    for name, (gpus, vcpus, ram, efa) in FACTS.items():
        t = catalog.INSTANCE_TYPES[name]
        assert (t.gpus, t.vcpus, t.memory_gib, t.efa) == (gpus, vcpus, ram, efa), name
        assert t.gpu_memory_mib == 22888 and t.gpu_model == "A10G"
        for region in ("us-east-1", "us-east-2", "us-west-2", "eu-west-1", "eu-central-1", "ap-northeast-1"):
            assert region in t.regions
    assert catalog.INSTANCE_TYPES["g5.48xlarge"].total_gpu_memory_mib == 8 * 22888
    assert catalog.SOURCE_DATE == "2026-11-28"


def test_a_good_spec_passes_through_the_generic_validate():
    assert validate(aws_spec()) == []


def test_defaults_are_reported_as_warnings():
    warnings = validate(aws_spec(region=None, instance_type=None, ssh_cidr=None))
    text = " ".join(warnings)
    assert "us-east-1" in text and "g5.xlarge" in text and "SSH is closed" in text
    assert catalog.region_of(aws_spec(region=None)) == "us-east-1"


def test_unknown_type_suggests_the_close_one():
    with pytest.raises(SpecError, match=r'did you mean "g5\.xlarge"') as exc:
        validate(aws_spec(instance_type="g5.xlarg"))
    assert "'g5.xlarg'" in str(exc.value)
    with pytest.raises(SpecError, match="p3.2xlarge"):
        validate(aws_spec(instance_type="p3.2xlarge"))


def test_region_where_g5_is_not_offered_is_refused_with_the_list():
    with pytest.raises(SpecError, match=r"not offered in region 'us-west-1'.*us-west-2"):
        validate(aws_spec(region="us-west-1"))
    with pytest.raises(SpecError, match=r'did you mean "us-east-1"'):
        validate(aws_spec(region="us-eats-1"))
    warnings = validate(aws_spec(region="us-west-1", options={"allowUnlistedRegion": "true"}))
    assert any("us-west-1" in w for w in warnings)


def test_zone_must_belong_to_the_region():
    assert validate(aws_spec(zone="us-east-1b")) == []
    with pytest.raises(SpecError, match="availability zone 'eu-west-1a'"):
        validate(aws_spec(zone="eu-west-1a"))


@pytest.mark.parametrize("nodes", [0, 65, -1])
def test_nodes_outside_1_to_64_are_refused(nodes):
    with pytest.raises(SpecError, match="nodes"):
        validate(aws_spec(nodes=nodes))


def test_gpus_per_node_must_match_the_type():
    assert validate(aws_spec(instance_type="g5.12xlarge", gpus_per_node=4)) == []
    with pytest.raises(SpecError, match=r"gpus per node for g5\.xlarge.*g5\.12xlarge, g5\.24xlarge"):
        validate(aws_spec(gpus_per_node=4))


def test_efa_only_on_types_that_support_it():
    with pytest.raises(SpecError, match=r"g5\.xlarge does not support it.*g5\.8xlarge"):
        validate(aws_spec(options={"efa": "true"}))
    assert validate(aws_spec(instance_type="g5.8xlarge", options={"efa": "true"})) == []
    one = validate(aws_spec(instance_type="g5.8xlarge", nodes=1, options={"efa": "true"}))
    assert any("single node" in w for w in one)
    with pytest.raises(SpecError, match="option efa 'maybe'"):
        validate(aws_spec(options={"efa": "maybe"}))


def test_spot_must_terminate_on_interruption():
    assert validate(aws_spec(spot=True, options={"spotInterruptionBehavior": "terminate"})) == []
    with pytest.raises(SpecError, match="'stop'.*cluster placement group must terminate"):
        validate(aws_spec(spot=True, options={"spotInterruptionBehavior": "stop"}))
    with pytest.raises(SpecError, match="needs spot=true"):
        validate(aws_spec(options={"spotInterruptionBehavior": "terminate"}))


@pytest.mark.parametrize("cidr", ["0.0.0.0/0"])  # ::/0: refused as IPv6 (below)
def test_ssh_open_to_the_world_needs_an_explicit_option(cidr):
    with pytest.raises(SpecError, match="allowOpenSsh=true"):
        validate(aws_spec(ssh_cidr=cidr))
    for key in ("allowOpenSsh", "allow_open_ssh"):
        warnings = validate(aws_spec(ssh_cidr=cidr, options={key: "true"}))
        assert any("open to" in w for w in warnings)
    with pytest.raises(SpecError):
        validate(aws_spec(ssh_cidr=cidr, options={"allowOpenSsh": "false"}))


def test_unknown_option_disk_type_accelerator_and_network_options():
    with pytest.raises(SpecError, match=r'aws option .*did you mean "allowOpenSsh"'):
        validate(aws_spec(options={"allowOpenSSH": "true"}))
    with pytest.raises(SpecError, match="root disk type 'gp2'"):
        validate(aws_spec(disk_type="gp2"))
    with pytest.raises(SpecError, match="accelerator 'nvidia-tesla-v100'"):
        validate(aws_spec(accelerator="nvidia-tesla-v100"))
    assert validate(aws_spec(accelerator="nvidia-a10g")) == []
    with pytest.raises(SpecError, match="needs subnetId"):
        validate(aws_spec(options={"vpcId": "vpc-1"}))
    with pytest.raises(SpecError, match="sshPublicKey"):
        validate(aws_spec(options={"sshPublicKey": "not a key"}))


@pytest.mark.parametrize("cidr", ["::/0", "2001:db8::/64"])
def test_ipv6_ssh_cidr_and_ecdsa_keys_are_refused(cidr):
    # the VPC and nodes are IPv4 only; EC2 ImportKeyPair takes ED25519 and RSA keys only
    # (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/create-key-pairs.html)
    with pytest.raises(SpecError, match=r"ssh CIDR '.*' is not allowed.*IPv4 only"):
        validate(aws_spec(ssh_cidr=cidr, options={"allowOpenSsh": "true"}))
    with pytest.raises(SpecError, match="sshPublicKey.*no ECDSA"):
        validate(aws_spec(options={"sshPublicKey": "ecdsa-sha2-nistp256 AAAAE2VjZHNh user@host"}))
    assert validate(aws_spec(options={"subnet_id": "subnet-1", "vpc_id": "vpc-1"})) == []


def test_vpc_cidr_must_fit_aws_limits_and_the_nodes():
    assert validate(aws_spec(options={"vpcCidr": "10.7.0.0/24"})) == []
    for bad in ("10.7.0.0/8", "10.7.0.1/24", "fd00::/64", "ten"):
        with pytest.raises(SpecError, match="option vpcCidr"):
            validate(aws_spec(options={"vpcCidr": bad}))
    with pytest.raises(SpecError, match="11 usable addresses, fewer than 12 nodes"):
        validate(aws_spec(nodes=12, options={"vpcCidr": "10.7.0.0/28"}))


# -- what run/up fill in before the plan (issue 12: reachable default, every GPU) -------------
def _checkip_server(body: bytes, status: int = 200):
    import http.server
    import threading

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/"


def test_detected_public_ip_becomes_the_ssh_cidr_and_gpus_come_from_the_type(monkeypatch):
    from gpucluster.infra.aws import catalog as cat
    from gpucluster.spec import ClusterSpec

    # checkip.amazonaws.com answers with the caller's address and a newline
    srv, url = _checkip_server(b"198.51.100.23\n")
    try:
        monkeypatch.setenv("GPUCLUSTER_CHECKIP_URL", url)
        spec, notes = cat.prepare(ClusterSpec(cloud="aws", nodes=2, instance_type="g5.12xlarge"))
    finally:
        srv.shutdown()
    assert spec.ssh_cidr == "198.51.100.23/32" and spec.gpus_per_node == 4
    assert "198.51.100.23/32" in notes[0]
    assert cat.plan_line(spec, 4, 11.344) == "2 × g5.12xlarge (4 × A10G each), 8 training processes, $11.34/h"
    # an explicit CIDR is kept and nothing is asked
    kept, notes = cat.prepare(ClusterSpec(cloud="aws", nodes=1, ssh_cidr="203.0.113.7/32"),
                                   detect=lambda: pytest.fail("detection must not run"))
    assert kept.ssh_cidr == "203.0.113.7/32" and kept.gpus_per_node == 1 and notes == []


@pytest.mark.parametrize("body,status", [(b"not an ip\n", 200), (b"", 503)])
def test_failed_detection_is_a_spec_error_saying_what_to_pass(monkeypatch, body, status):
    from gpucluster.infra.aws import catalog as cat
    from gpucluster.spec import ClusterSpec

    srv, url = _checkip_server(body, status)
    try:
        monkeypatch.setenv("GPUCLUSTER_CHECKIP_URL", url)
        with pytest.raises(SpecError, match=r"--ssh-cidr") as err:
            cat.prepare(ClusterSpec(cloud="aws", nodes=2))
    finally:
        srv.shutdown()
    assert url in str(err.value) and "\n" not in str(err.value)


def test_unreachable_checkip_fails_within_the_timeout():
    import time as _t

    from gpucluster.infra.aws import catalog as cat

    start = _t.monotonic()
    with pytest.raises(SpecError, match="could not detect"):
        cat.detect_public_ipv4("http://127.0.0.1:9/", timeout=5)  # discard port: refused
    assert _t.monotonic() - start < 6


def test_image_option_is_checked():
    from gpucluster.spec import ClusterSpec
    from specs import validate

    with pytest.raises(SpecError, match="option image 'ubuntu' is not allowed"):
        validate(ClusterSpec(cloud="aws", nodes=1, ssh_cidr="203.0.113.7/32", options=(("image", "ubuntu"),)))
    with pytest.raises(SpecError, match="cannot be combined"):
        validate(ClusterSpec(cloud="aws", nodes=1, ssh_cidr="203.0.113.7/32",
                             options=(("ami", "ami-1"), ("image", "base"))))


def test_console_tail_decodes_get_console_output(monkeypatch):
    """EC2 GetConsoleOutput returns the console text base64-encoded (EC2 API reference,
    https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_GetConsoleOutput.html); moto
    plays EC2 here."""
    moto = pytest.importorskip("moto")
    import boto3

    from gpucluster.infra.aws.outputs import console_tail
    from gpucluster.domain import Cluster, Node

    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, "testing")
    with moto.mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        image = ec2.describe_images()["Images"][0]["ImageId"]
        iid = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
        node = Node(rank=0, host="198.51.100.10", private_ip="10.0.0.1", user="ubuntu", instance_id=iid, gpus=1)
        cluster = Cluster(name="c", cloud="aws", nodes=(node,), region="us-east-1")
        text = console_tail(cluster, node, lines=3, client=ec2)
    assert text.startswith(f"console output of {iid} (last ") and " | " in text
    assert console_tail(cluster, Node(rank=1, host="h", private_ip="p", user="u"), client=object()) is None


def test_an_address_detected_through_a_proxy_is_flagged_in_the_plan(monkeypatch):
    """urllib's urlopen sends the checkip request through HTTPS_PROXY (Python docs, urllib.request:
    getproxies reads the <scheme>_proxy variables, NO_PROXY exempts hosts), so the detected address is
    the proxy's. The plan says so, without the proxy's credentials."""
    from gpucluster.infra.aws.catalog import prepare

    for var in ("HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy", "GPUCLUSTER_CHECKIP_URL"):
        monkeypatch.delenv(var, raising=False)
    s = ClusterSpec(cloud="aws", nodes=1, region="us-east-1", instance_type="g5.xlarge")
    _, notes = prepare(s, detect=lambda: "198.51.100.23")
    assert not any("proxy" in n for n in notes)
    monkeypatch.setenv("https_proxy", "http://alice:secret@proxy.corp.example:3128")
    _, notes = prepare(s, detect=lambda: "198.51.100.23")
    (flag,) = [n for n in notes if "proxy" in n]
    assert "detected through the proxy http://proxy.corp.example:3128" in flag and "--ssh-cidr" in flag
    assert "secret" not in flag and "alice" not in flag
    monkeypatch.setenv("no_proxy", "checkip.amazonaws.com")
    _, notes = prepare(s, detect=lambda: "198.51.100.23")
    assert not any("proxy" in n for n in notes)
