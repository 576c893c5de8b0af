"""The tag scan behind `gc` and the teardown check, against moto (boto3) and a fake GKE client.

Ours (tagged managed-by=gpucluster) is found and deleted; someone else's untagged resources in the
same account are left alone; another live cluster's resources are not touched by `gc`."""

from __future__ import annotations

from google_fake import FakeProject

from gpucluster.infra.leftovers import scope_of
from gpucluster.infra.registry import plugin as _plugin

import json
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("boto3")
moto = pytest.importorskip("moto")

from gpucluster.infra import leftovers  # noqa: E402
from gpucluster.infra.gcp import leftovers as gcp_leftovers  # noqa: E402

REGION = "us-east-1"


@pytest.fixture
def aws(monkeypatch):
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with moto.mock_aws():
        import boto3

        yield boto3.session.Session(region_name=REGION)


def tags(cluster: str | None, run: str | None = None, name: str = "x", owner: str | None = None):
    t = [{"Key": "Name", "Value": name}]
    if cluster:
        t += [{"Key": "managed-by", "Value": "gpucluster"}, {"Key": "gpucluster-cluster", "Value": cluster}]
    if run:
        t.append({"Key": "gpucluster-run", "Value": run})
    if owner:  # the marks every resource of a run carries (gpucluster.ownership)
        t += [{"Key": "gpucluster-owner", "Value": owner}, {"Key": "gpucluster-user", "Value": "alice"},
              {"Key": "gpucluster-host", "Value": "laptop"}]
    return t


def spec_tags(kind: str, cluster: str | None, run: str | None = None, owner: str | None = None):
    return [{"ResourceType": kind, "Tags": tags(cluster, run, f"{cluster or 'theirs'}-{kind}", owner)}]


def make_cluster(session, cluster: str | None, run: str | None = None, owner: str | None = None) -> dict:
    """A small cluster's worth of EC2/IAM resources; cluster=None makes someone else's (untagged).
    IAM roles and profiles go where the component makes them: under /gpucluster/<owner>/<region>/<cluster>/."""
    from gpucluster.infra.aws.leftovers import iam_path

    mine = f"-{owner}" if owner else ""

    ec2 = session.client("ec2", region_name=REGION)
    iam = session.client("iam")
    label = cluster or "theirs"
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16", TagSpecifications=spec_tags("vpc", cluster, run, owner))["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.42.1.0/24",
                               TagSpecifications=spec_tags("subnet", cluster, run, owner))["Subnet"]["SubnetId"]
    sg = ec2.create_security_group(GroupName=f"{label}{mine}-sg", Description="t", VpcId=vpc,
                                   TagSpecifications=spec_tags("security-group", cluster, run, owner))["GroupId"]
    key = ec2.create_key_pair(KeyName=f"{label}{mine}-key",
                              TagSpecifications=spec_tags("key-pair", cluster, run, owner))
    vol = ec2.create_volume(AvailabilityZone=f"{REGION}a", Size=10,
                            TagSpecifications=spec_tags("volume", cluster, run, owner))["VolumeId"]
    inst = ec2.run_instances(ImageId="ami-12c6146b", MinCount=2, MaxCount=2, InstanceType="g5.xlarge",
                             SubnetId=subnet, SecurityGroupIds=[sg],
                             TagSpecifications=spec_tags("instance", cluster, run, owner))["Instances"]
    role_tags = tags(cluster, run, owner=owner) if cluster else []
    where = {"Path": iam_path(owner, REGION, cluster)} if cluster else {}
    iam.create_role(RoleName=f"{label}{mine}-role", AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17",
                    "Statement": []}), **where, **({"Tags": role_tags} if role_tags else {}))
    iam.create_instance_profile(InstanceProfileName=f"{label}{mine}-profile", **where,
                                **({"Tags": role_tags} if role_tags else {}))
    iam.add_role_to_instance_profile(InstanceProfileName=f"{label}{mine}-profile",
                                     RoleName=f"{label}{mine}-role")
    return {"vpc": vpc, "subnet": subnet, "sg": sg, "key": key["KeyName"], "volume": vol,
            "instances": [i["InstanceId"] for i in inst], "role": f"{label}{mine}-role",
            "profile": f"{label}{mine}-profile"}


def test_finds_ours_and_leaves_theirs_alone(aws):
    ours = make_cluster(aws, "demo", run="r1")
    theirs = make_cluster(aws, None)
    report = leftovers.scan(_plugin("aws").provisioner, name="demo", scope=scope_of({"regions": [REGION], "session": aws}))
    by_kind: dict[str, set[str]] = {}
    for lo in report.leftovers:
        by_kind.setdefault(lo.kind, set()).add(lo.id)
    assert by_kind["instance"] == set(ours["instances"])
    assert by_kind["security-group"] == {ours["sg"]}
    assert by_kind["key-pair"] == {ours["key"]}
    assert by_kind["volume"] == {ours["volume"]}
    assert by_kind["vpc"] == {ours["vpc"]} and by_kind["subnet"] == {ours["subnet"]}
    assert by_kind["iam-role"] == {ours["role"]} and by_kind["instance-profile"] == {ours["profile"]}
    every_id = {lo.id for lo in report.leftovers}
    assert not every_id & {theirs["sg"], theirs["vpc"], theirs["key"], theirs["volume"], *theirs["instances"]}
    assert report.skipped == [] and report.check.verdict == "leftovers"


def test_delete_removes_ours_only_and_the_check_comes_back_empty(aws):
    ours = make_cluster(aws, "demo")
    theirs = make_cluster(aws, None)
    found = leftovers.find_leftovers(_plugin("aws").provisioner, name="demo", scope=scope_of({"regions": [REGION], "session": aws}))
    assert found.leftovers and found.verdict == "leftovers"
    errors = leftovers.delete_leftovers(_plugin("aws").provisioner, found, scope_of({"session": aws}), 30)
    assert errors == []
    after = leftovers.find_leftovers(_plugin("aws").provisioner, name="demo", scope=scope_of({"regions": [REGION], "session": aws}))
    assert after.leftovers == () and after.verdict == "verified"
    ec2 = aws.client("ec2", region_name=REGION)
    states = {i["InstanceId"]: i["State"]["Name"] for r in ec2.describe_instances()["Reservations"]
              for i in r["Instances"]}
    assert all(states[i] == "terminated" for i in ours["instances"])
    assert all(states[i] == "running" for i in theirs["instances"])
    assert ec2.describe_security_groups(GroupIds=[theirs["sg"]])["SecurityGroups"]
    assert ec2.describe_volumes(VolumeIds=[theirs["volume"]])["Volumes"]
    assert [k["KeyName"] for k in ec2.describe_key_pairs()["KeyPairs"]] == [theirs["key"]]
    assert ec2.describe_vpcs(VpcIds=[theirs["vpc"]])["Vpcs"]
    iam = aws.client("iam")
    assert {r["RoleName"] for r in iam.list_roles()["Roles"]} == {theirs["role"]}


def test_a_check_that_cannot_run_is_never_clean(aws, monkeypatch):
    """An endpoint that does not implement a call (moto's own DescribePlacementGroups) makes the
    verdict "not verified", naming the check, never "verified"."""
    from moto.ec2.responses import EC2Response

    monkeypatch.delattr(EC2Response, "describe_placement_groups")
    check = leftovers.find_leftovers(_plugin("aws").provisioner, name="demo", scope=scope_of({"regions": [REGION], "session": aws}))
    assert check.leftovers == () and check.verdict == "not verified"
    assert check.unchecked == ("placement groups in us-east-1: not checked (the endpoint does not implement it)",)


def test_no_credentials_is_not_verified(monkeypatch, tmp_path):
    """Bug: without credentials every AWS call fails; that is 12 checks not run, not "nothing left"."""
    import boto3

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    check = leftovers.find_leftovers(_plugin("aws").provisioner, name="demo", scope=scope_of({"regions": [REGION], "session": boto3.session.Session()}))
    assert check.verdict == "not verified" and check.leftovers == ()
    assert len(check.unchecked) >= 12 and all("not checked" in u for u in check.unchecked)
    assert any("credentials" in u.lower() for u in check.unchecked)


def test_gc_view_skips_live_clusters_and_filters_by_run(aws):
    make_cluster(aws, "kept", run="r-old")
    make_cluster(aws, "crashed", run="r-new")
    everything = leftovers.scan(_plugin("aws").provisioner, scope=scope_of({"regions": [REGION], "session": aws}))
    assert {f.cluster for f in everything.found} == {"kept", "crashed"}
    not_live = leftovers.scan(_plugin("aws").provisioner, live_clusters=["kept"], scope=scope_of({"regions": [REGION], "session": aws}))
    assert {f.cluster for f in not_live.found} == {"crashed"}
    by_run = leftovers.find_leftovers(_plugin("aws").provisioner, run_id="r-old", scope=scope_of({"regions": [REGION], "session": aws})).leftovers
    assert by_run and all("cluster=kept" in lo.detail for lo in by_run)


def test_terminated_instances_are_not_leftovers(aws):
    ours = make_cluster(aws, "demo")
    ec2 = aws.client("ec2", region_name=REGION)
    ec2.terminate_instances(InstanceIds=ours["instances"])
    kinds = {lo.kind for lo in leftovers.find_leftovers(_plugin("aws").provisioner, name="demo", scope=scope_of({"regions": [REGION], "session": aws})).leftovers}
    assert "instance" not in kinds and "security-group" in kinds


def test_bad_cloud_is_named():
    from gpucluster.errors import UsageError

    with pytest.raises(UsageError, match="'azure'.*allowed: local, ssh, aws, gcp"):
        _plugin("azure")  # the composition root refuses it before any scan


# -- GKE with a fake ClusterManagerClient (clearly a fake: records calls) -------------------------
class FakeGke:
    """FAKE google.cloud.container_v1.ClusterManagerClient: list_clusters/delete_cluster only."""

    def __init__(self, clusters):
        self.clusters = clusters
        self.deleted: list[str] = []
        self.parents: list[str] = []

    def list_clusters(self, parent):
        self.parents.append(parent)
        alive = [c for c in self.clusters if c.name not in {d.rsplit("/", 1)[-1] for d in self.deleted}]
        return SimpleNamespace(clusters=alive)

    def delete_cluster(self, name):
        self.deleted.append(name)


def gke(name, labels, location="us-central1-a"):
    return SimpleNamespace(name=name, location=location, resource_labels=labels,
                           status=SimpleNamespace(name="RUNNING"))


def test_gke_scan_by_label():
    client = FakeGke([
        gke("demo", {"managed-by": "gpucluster", "gpucluster-cluster": "demo"}),
        gke("other-team", {"team": "ml"}),
        gke("kept", {"managed-by": "gpucluster", "gpucluster-cluster": "kept"}),
    ])
    report = leftovers.scan(_plugin("gcp").provisioner, live_clusters=["kept"], scope=scope_of({"project": "proj-one", "gke_client": client, "google": FakeProject()}))
    assert client.parents == ["projects/proj-one/locations/-"]
    assert [lo.id for lo in report.leftovers] == ["projects/proj-one/locations/us-central1-a/clusters/demo"]
    assert leftovers.delete_leftovers(_plugin("gcp").provisioner, report.leftovers, scope_of({"gke_client": client, "google": FakeProject()})) == []
    assert client.deleted == ["projects/proj-one/locations/us-central1-a/clusters/demo"]
    assert leftovers.find_leftovers(_plugin("gcp").provisioner, name="demo", scope=scope_of({"project": "proj-one", "gke_client": client, "google": FakeProject()})).verified


def test_gke_without_project_is_reported_not_silently_empty(monkeypatch):
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    monkeypatch.delenv("CLOUDSDK_CORE_PROJECT", raising=False)
    monkeypatch.setattr(gcp_leftovers, "gcp_project", lambda *a: None)
    report = leftovers.scan(_plugin("gcp").provisioner, scope=scope_of({"gke_client": FakeGke([]), "google": FakeProject()}))
    assert report.leftovers == [] and "--project" in report.skipped[0]
