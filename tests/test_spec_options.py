"""One representation of a spec's backend options (issue 23 item 6): each option under its one
spelling, object-storage scopes as URL fields, the project as a field; unknown keys refused for
every backend (gcp accepted any key before, silently)."""

from __future__ import annotations

import pytest

from gpucluster.errors import SpecError
from gpucluster.infra.registry import plugin
from gpucluster.spec import ClusterSpec, key_forms, normalize, validate

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def test_key_forms_are_twins():
    assert key_forms("allowOpenSsh") == ("allowOpenSsh", "allow_open_ssh")
    assert key_forms("allow_open_ssh") == ("allowOpenSsh", "allow_open_ssh")
    assert key_forms("private_ips") == ("privateIps", "private_ips")


@pytest.mark.parametrize("given", ["subnet_id", "subnetId"])
def test_either_spelling_is_stored_as_the_backends_one(given):
    aws = plugin("aws")
    spec = normalize(ClusterSpec(cloud="aws", nodes=1, name="dd", options=((given, "subnet-1"), ("vpc_id", "vpc-1"))), aws)
    assert spec.options == (("subnetId", "subnet-1"), ("vpcId", "vpc-1"))
    assert spec.option("subnetId") == "subnet-1"
    ssh = plugin("ssh")  # its one spelling is snake_case: the camelCase twin becomes it
    assert normalize(ClusterSpec(cloud="ssh", nodes=1, name="dd", options=(("privateIps", "10.0.0.1"),)),
                     ssh).options == (("private_ips", "10.0.0.1"),)


def test_a_spelling_left_unnormalized_is_refused_not_ignored():
    """The backends read options by their one name only: a twin that skipped `normalize` must not pass
    validation and then be silently ignored."""
    with pytest.raises(SpecError, match=r"aws option 'subnet_id' is not allowed \(did you mean \"subnetId\"\?\)"):
        validate(ClusterSpec(cloud="aws", nodes=1, name="dd", options=(("subnet_id", "s"),)), plugin("aws"))


def test_unknown_options_are_named_as_given_for_every_backend():
    for cloud, bad, near in (("aws", "colour", None), ("gcp", "relaseChannel", "releaseChannel"),
                             ("ssh", "private_ip", "private_ips"), ("local", "efa", None)):
        chosen = plugin(cloud)
        spec = normalize(ClusterSpec(cloud=cloud, nodes=1, name="dd", options=((bad, "x"),)), chosen)
        with pytest.raises(SpecError) as exc:
            validate(spec, chosen)
        assert f"{cloud} option {bad!r} is not allowed" in exc.value.message
        if near:
            assert f'did you mean "{near}"' in exc.value.message


def test_scopes_and_project_are_lifted_into_fields():
    gcp = plugin("gcp")
    spec = ClusterSpec(cloud="gcp", nodes=1, name="dd", reads=("gs://a-bkt/x",),
                       options=(("gcs_read", '["gs://b-bkt/y", "gs://a-bkt/x"]'), ("gcsWrite", "gs://out-bkt/r"),
                                ("project", "my-proj-42"), ("autoscale", "false")))
    got = normalize(spec, gcp)
    assert got.reads == ("gs://a-bkt/x", "gs://b-bkt/y") and got.writes == ("gs://out-bkt/r",)
    assert got.project == "my-proj-42" and got.project_source == "option project"
    assert got.options == (("autoscale", "false"),)
    assert normalize(got, gcp) == got  # idempotent
    with pytest.raises(SpecError, match="option s3Read 's3://UPPER' is not allowed"):
        normalize(ClusterSpec(cloud="aws", nodes=1, name="dd", options=(("s3Read", "s3://UPPER"),)), plugin("aws"))
    # a backend without object storage keeps the key, and validation names it
    local = plugin("local")
    with pytest.raises(SpecError, match="local option 's3Read' is not allowed"):
        validate(normalize(ClusterSpec(cloud="local", nodes=1, name="dd", options=(("s3Read", "s3://a-bkt"),)), local),
                 local)


def test_recorded_specs_of_either_shape_read_back_the_same():
    new = ClusterSpec(cloud="gcp", nodes=2, name="dd", project="p-123456", project_source="--project",
                      reads=("gs://a-bkt",), writes=("gs://b-bkt/o",), options=(("autoscale", "false"),))
    assert ClusterSpec.from_dict(new.to_dict()) == new
    old = {"cloud": "gcp", "nodes": 2, "name": "dd",  # recorded before the fields existed
           "options": {"project": "p-123456", "projectSource": "--project", "gcsRead": '["gs://a-bkt"]',
                       "gcsWrite": '["gs://b-bkt/o"]', "autoscale": "false"}}
    assert normalize(ClusterSpec.from_dict(old), plugin("gcp")) == new


def test_a_scope_option_that_skipped_normalize_is_refused_not_dropped():
    """The typed fields are the only place the component reads grants from: a spec still carrying
    `s3Read` (built without `normalize`) must fail validation, never run without its grant."""
    for cloud, key in (("aws", "s3Read"), ("gcp", "gcsRead"), ("gcp", "project")):
        with pytest.raises(SpecError, match=f"{cloud} option '{key}' is not allowed"):
            validate(ClusterSpec(cloud=cloud, nodes=1, name="dd", options=((key, "x"),)), plugin(cloud))
