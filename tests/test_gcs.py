"""`--data gs://...` and `--output gs://...` on gcp, piece by piece: URL checks (Cloud Storage
bucket naming rules), the IAM bindings and Workload Identity the component declares (under
Pulumi's mock runtime), and the backend hooks. The pods' program against a GCS JSON API on
loopback: tests/test_gcs_node.py."""

from __future__ import annotations

import json
import re

import pytest

from gpucluster.errors import SpecError, UsageError
from gpucluster.infra.gcp import gcs
from gpucluster.infra.registry import plugin, readers
from gpucluster.spec import ClusterSpec
from gpucluster.watch.staging import DataMount, parse_data

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

_ACCOUNT_ID_RE = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")  # IAM's rule for service account IDs


# -- URLs ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("value,mount", [
    ("gs://my-bucket/train/shards", DataMount("gs://my-bucket/train/shards", "data/shards")),
    ("gs://my-bucket/train/shards/", DataMount("gs://my-bucket/train/shards", "data/shards")),
    ("gs://my_bucket", DataMount("gs://my_bucket", "data/my_bucket")),
    ("gs://my-bucket:inputs", DataMount("gs://my-bucket", "inputs")),
    ("gs://data.example.com/a/b:in/x", DataMount("gs://data.example.com/a/b", "in/x")),
    ("gs://" + ".".join(["a" * 63] * 3), DataMount("gs://" + ".".join(["a" * 63] * 3), "data/" + ".".join(["a" * 63] * 3))),
])
def test_gs_sources_parse_on_gcp_with_dest_after_the_last_colon(value, mount):
    got = parse_data([value], plugin("gcp"))
    assert got == (mount,) and got[0].remote


@pytest.mark.parametrize("url,needle", [
    ("gs://ab", "3-63"), ("gs://" + "a" * 64, "3-63"), ("gs://" + ".".join(["a" * 70, "b"]), "longer than 63"),
    ("gs://" + ".".join(["a" * 60] * 4), "up to 222"), ("gs://My-Bucket", "lowercase"), ("gs://sp ace", "lowercase"),
    ("gs://-start", "start and end"), ("gs://end_", "start and end"), ("gs://a..b", "empty dot-separated"),
    ("gs://192.168.5.4", "IP address"), ("gs://goog-data", "'goog'"), ("gs://my-google-data", "'google'"),
    ("gs://my-g00gle-data", "'google'"), ("gs://", "no bucket name"), ("gs://bucket/a*b", "'*'"),
    ("gs://bucket/a?b", "'?'"), ("gs://bucket/a[0]", "'['"), ("gs://bucket/a\"b", "'\"'"),
    ("gs://bucket/a\\b", "'\\\\'"), ("gs://bucket/a'b", '"\'"'), ("gs://bucket/a\nb", "'\\n'"),
    ("gs://bucket/a//b", "empty"), ("gs://bucket/a/../b", "'..'"), ("gs://bucket/./b", "'.'"),
    ("gs://bucket/" + "x" * 901, "900 bytes"), ("gs://bucket/.well-known/acme-challenge/x", "acme-challenge"),
    ("GS://bucket", "gs://BUCKET"), ("s3://bucket", "gs://BUCKET"),
])
def test_malformed_gs_urls_are_refused_naming_the_value_and_the_rule(url, needle):
    with pytest.raises(UsageError) as exc:
        gcs.parse_url(url, f"--output {url!r}")
    msg = exc.value.message
    assert msg.startswith(f"--output {url!r} is not allowed") and needle in msg, msg
    assert "gs://BUCKET[/PREFIX]" in msg


def test_the_backend_declares_gs_and_other_clouds_refuse_it():
    gcp = plugin("gcp")
    assert gcp.object_store == "gs"
    assert gcp.object_url("gs://out-bkt/runs/", "--output x") == "gs://out-bkt/runs"
    with pytest.raises(UsageError) as exc:
        parse_data(["gs://bucket/p"], plugin("aws"), readers())
    assert "not supported yet with --cloud aws" in exc.value.message and "gs:// works with --cloud gcp" in exc.value.message
    with pytest.raises(UsageError) as exc:
        parse_data(["s3://bucket/p"], gcp, readers())
    assert "s3:// works with --cloud aws" in exc.value.message
    from gpucluster.watch.outputs import check_output_dest

    assert check_output_dest("gs://out-bkt/runs/exp1/", gcp) == "gs://out-bkt/runs/exp1"


def test_access_rides_in_the_spec_fields_and_stack_file_options_are_lifted_and_checked():
    from specs import normalize

    spec = ClusterSpec(cloud="gcp", nodes=1, name="d", project="p1")
    spec = plugin("gcp").with_object_access(spec, ["gs://data-bkt/train", "gs://data-bkt/train"], ["gs://out-bkt/r"])
    assert spec.reads == ("gs://data-bkt/train",) and spec.options == ()
    assert gcs.scopes(spec) == (["gs://data-bkt/train"], ["gs://out-bkt/r"])
    assert gcs.scopes(plugin("gcp").with_object_access(spec, [], [])) == ([], [])  # replaced, not added to
    assert spec.project == "p1"
    # a stack file (or --option) gives them as options: lifted into the fields, checked on the way
    with pytest.raises(SpecError, match="option gcsRead 'gs://UPPER' is not allowed.*lowercase"):
        normalize(spec.replace(options=(("gcsRead", '["gs://UPPER"]'),)))
    with pytest.raises(SpecError, match="a JSON list of gs:// URLs"):
        normalize(spec.replace(options=(("gcsWrite", '[1, 2]'),)))
    single = normalize(spec.replace(writes=(), options=(("gcs_write", "gs://ok-bucket/out"),)))  # one URL, snake_case
    assert single.options == () and gcs.scopes(single) == (["gs://data-bkt/train"], ["gs://ok-bucket/out"])
    with pytest.raises(SpecError, match="read scope 'gs://Bad'.*lowercase"):  # a field set by hand is checked too
        gcs.scopes(spec.replace(reads=("gs://Bad",)))
    # validated where every gcp spec is (gpucluster.spec.validate -> catalog.validate_spec)
    from gpucluster.infra.gcp.catalog import validate_spec

    with pytest.raises(SpecError, match="lowercase"):
        validate_spec(ClusterSpec(cloud="gcp", nodes=1, name="d", reads=("gs://Bad",)))
    with pytest.raises(SpecError, match="option namespace 'Team_A'"):
        validate_spec(ClusterSpec(cloud="gcp", nodes=1, name="d", reads=("gs://ok-bkt",),
                                  options=(("namespace", "Team_A"),)))


# -- IAM -----------------------------------------------------------------------------------------
def test_bindings_grant_exactly_the_prefixes_and_nothing_wide():
    rows = gcs.iam_bindings(["gs://data-bkt/train", "gs://data-bkt/train/shards", "gs://whole-bkt"],
                            ["gs://out-bkt/runs/exp1"])
    by_url = {r["url"]: r for r in rows}
    assert sorted(by_url) == ["gs://data-bkt/train", "gs://out-bkt/runs/exp1", "gs://whole-bkt"]  # shards is covered
    read = by_url["gs://data-bkt/train"]
    assert (read["bucket"], read["role"]) == ("data-bkt", "roles/storage.objectViewer")
    # objects.get is checked on the object's name, objects.list on the bucket with the request's
    # prefix in the objectListPrefix API attribute (sources in gcs.read_condition)
    assert read["condition_expression"] == (
        'resource.name.startsWith("projects/_/buckets/data-bkt/objects/train/") || '
        'api.getAttribute("storage.googleapis.com/objectListPrefix", "").startsWith("train/")')
    assert read["condition_title"] == "gpucluster read gs://data-bkt/train"
    write = by_url["gs://out-bkt/runs/exp1"]
    assert (write["bucket"], write["role"]) == ("out-bkt", "roles/storage.objectCreator")
    assert write["condition_expression"] == 'resource.name.startsWith("projects/_/buckets/out-bkt/objects/runs/exp1/")'
    whole = by_url["gs://whole-bkt"]  # the whole bucket was asked for: no condition
    assert whole["role"] == "roles/storage.objectViewer" and whole["condition_expression"] is None
    assert {r["role"] for r in rows} == {"roles/storage.objectViewer", "roles/storage.objectCreator"}
    # the trailing '/' keeps a sibling prefix out: train/ does not admit trainer/
    assert 'objects/train/")' in read["condition_expression"] and '"train/")' in read["condition_expression"]


def test_condition_titles_fit_and_differ():
    long_a = "gs://data-bkt/" + "p" * 200 + "/a"
    long_b = "gs://data-bkt/" + "p" * 200 + "/b"
    rows = gcs.iam_bindings([long_a, long_b], [long_a])
    titles = [r["condition_title"] for r in rows]
    assert all(len(t) <= 100 for t in titles) and len(set(titles)) == 3
    assert all(len(r["condition_description"]) <= 256 for r in rows)


@pytest.mark.parametrize("name", ["a", "ab", "v100", "my-cluster", "x" * 40, "team-a-very-long-cluster-name-1",
                                  "team-a-very-long-cluster-name-2", "a--b", "9lives"])
def test_service_account_ids_follow_iam_rules(name):
    got = gcs.account_id(name)
    assert _ACCOUNT_ID_RE.match(got) and 6 <= len(got) <= 30, got
    assert gcs.account_id(name) == got  # stable: the same cluster gets the same account


def test_long_cluster_names_get_distinct_accounts():
    assert gcs.account_id("team-a-very-long-cluster-name-1") != gcs.account_id("team-a-very-long-cluster-name-2")
    assert gcs.workload_member("my-proj", "default", gcs.OBJECTS_KSA) == \
        "serviceAccount:my-proj.svc.id.goog[default/gpucluster-objects]"


# -- the component, under Pulumi's mock runtime --------------------------------------------------
pulumi = pytest.importorskip("pulumi")

ACCOUNT = "gcp:serviceaccount/account:Account"
BUCKET_MEMBER = "gcp:storage/bucketIAMMember:BucketIAMMember"
SA_MEMBER = "gcp:serviceaccount/iAMMember:IAMMember"
CLUSTER = "gcp:container/cluster:Cluster"


class _Mocks(pulumi.runtime.Mocks):
    def __init__(self):
        self.resources = []

    def new_resource(self, args):
        self.resources.append(args)
        out = dict(args.inputs)
        if args.typ == ACCOUNT:
            email = f"{args.inputs['accountId']}@{args.inputs['project']}.iam.gserviceaccount.com"
            out.update(email=email, name=f"projects/{args.inputs['project']}/serviceAccounts/{email}")
        if args.typ == CLUSTER:
            out.update(endpoint="203.0.113.10", masterAuth={"clusterCaCertificate": "Q0E="})
        return [f"{args.name}-id", out]

    def call(self, args):
        return {}

    def of_type(self, typ):
        return [r for r in self.resources if r.typ == typ]


@pytest.fixture
def mocks():
    pytest.importorskip("pulumi_gcp")
    m = _Mocks()
    pulumi.runtime.set_mocks(m, project="gpucluster", stack="gcp-gcs", preview=False)
    return m


def _spec(**options) -> ClusterSpec:
    spec = ClusterSpec(cloud="gcp", nodes=2, name="v100", zone="us-central1-a", instance_type="n1-standard-16",
                       accelerator="nvidia-tesla-v100", gpus_per_node=4, run_id="r20261122-031500-abc123",
                       project="my-proj", options=tuple(options.pop("extra", ())))
    return plugin("gcp").with_object_access(spec, options.get("reads", ()), options.get("writes", ()))


def _declare(spec):
    from gpucluster.infra.gcp.component import declare
    from gpucluster.infra.gcp.plugin import PLUGIN

    return declare(spec, PLUGIN)


@pulumi.runtime.test
def test_component_binds_a_pods_account_to_exactly_the_prefixes(mocks):
    outputs = _declare(_spec(reads=["gs://data-bkt/train"], writes=["gs://out-bkt/runs"]))
    assert {"objects_service_account", "objects_ksa", "objects_namespace", "objects_grants"} <= set(outputs)

    def check(args):
        email, ksa, namespace, grants = args
        assert grants == [f"roles/storage.objectViewer on gs://data-bkt if {gcs.read_condition('data-bkt', 'train')}",
                          f"roles/storage.objectCreator on gs://out-bkt if {gcs.write_condition('out-bkt', 'runs')}"]
        (account,) = mocks.of_type(ACCOUNT)
        assert account.inputs["accountId"] == "gpuc-v100" and account.inputs["project"] == "my-proj"
        assert email == "gpuc-v100@my-proj.iam.gserviceaccount.com" and (ksa, namespace) == ("gpucluster-objects", "default")
        members = sorted(mocks.of_type(BUCKET_MEMBER), key=lambda r: r.inputs["bucket"])
        assert [(m.inputs["bucket"], m.inputs["role"]) for m in members] == [
            ("data-bkt", "roles/storage.objectViewer"), ("out-bkt", "roles/storage.objectCreator")]
        for m in members:
            assert m.inputs["member"] == f"serviceAccount:{email}"
        assert members[0].inputs["condition"]["expression"] == gcs.read_condition("data-bkt", "train")
        assert members[0].inputs["condition"]["title"] == "gpucluster read gs://data-bkt/train"
        assert members[1].inputs["condition"]["expression"] == \
            'resource.name.startsWith("projects/_/buckets/out-bkt/objects/runs/")'
        (wi,) = mocks.of_type(SA_MEMBER)
        assert wi.inputs["role"] == "roles/iam.workloadIdentityUser"
        assert wi.inputs["member"] == "serviceAccount:my-proj.svc.id.goog[default/gpucluster-objects]"
        assert wi.inputs["serviceAccountId"] == f"projects/my-proj/serviceAccounts/{email}"
        # nothing broader: no project-level IAM, no bucket-wide admin role, no keys
        types = {r.typ for r in mocks.resources}
        assert not any("projectIam" in t or "organizations" in t or "/key:" in t for t in types), types
        assert not any(r.inputs.get("role") in ("roles/storage.admin", "roles/storage.objectAdmin")
                       for r in mocks.resources)
        for r in [account, *members, wi]:
            assert r.name.startswith("v100-")
        # the cluster still runs its pods' metadata through the GKE metadata server
        (cluster,) = mocks.of_type(CLUSTER)
        assert cluster.inputs["workloadIdentityConfig"] == {"workloadPool": "my-proj.svc.id.goog"}

    return pulumi.Output.all(outputs["objects_service_account"], outputs["objects_ksa"],
                             outputs["objects_namespace"], outputs["objects_grants"]).apply(check)


@pulumi.runtime.test
def test_the_namespace_option_and_a_whole_bucket(mocks):
    outputs = _declare(_spec(reads=["gs://whole-bkt"], extra=(("namespace", "team-a"),)))

    def check(_):
        (member,) = mocks.of_type(BUCKET_MEMBER)
        assert member.inputs["role"] == "roles/storage.objectViewer" and "condition" not in member.inputs
        (wi,) = mocks.of_type(SA_MEMBER)
        assert wi.inputs["member"] == "serviceAccount:my-proj.svc.id.goog[team-a/gpucluster-objects]"

    return pulumi.Output.all(*outputs.values()).apply(check)


@pulumi.runtime.test
def test_nothing_is_declared_without_gcs_options(mocks):
    outputs = _declare(_spec())
    assert not any(k.startswith("objects_") for k in outputs)

    def check(_):
        types = {r.typ for r in mocks.resources}
        assert ACCOUNT not in types and BUCKET_MEMBER not in types and SA_MEMBER not in types
        assert CLUSTER in types

    return pulumi.Output.all(*outputs.values()).apply(check)


def test_a_bad_url_in_a_stack_option_is_refused_before_any_resource(mocks):
    spec = _spec().replace(writes=("gs://goog-out/x",))
    with pytest.raises(SpecError, match="'goog'"):
        _declare(spec)
    assert mocks.resources == []


def test_dry_run_shows_the_grants():
    pytest.importorskip("pulumi_gcp")
    spec = _spec(reads=["gs://data-bkt/train"], writes=["gs://out-bkt/runs"])
    text = plugin("gcp").ops.dry_run(spec, None, None)["text"]
    assert "account_id=gpuc-v100, project=my-proj" in text
    assert f"grants=roles/storage.objectViewer on gs://data-bkt if {gcs.read_condition('data-bkt', 'train')}" in text
    assert f"grants=roles/storage.objectCreator on gs://out-bkt if {gcs.write_condition('out-bkt', 'runs')}" in text
    assert "grants=roles/iam.workloadIdentityUser to serviceAccount:my-proj.svc.id.goog[default/gpucluster-objects]" \
        in text
