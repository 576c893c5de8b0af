"""Issue 40 item 12: buckets whose default encryption is SSE-KMS with a customer managed key.

S3 serves and stores such objects only for a caller that may also use the key ("Using server-side
encryption with AWS KMS keys (SSE-KMS)", S3 User Guide: downloads need kms:Decrypt, uploads
kms:GenerateDataKey; multipart uploads kms:Decrypt too). The nodes' role had only the S3 actions,
so `--data`/`--output` on such a bucket failed on the node with AccessDenied. `prepare` now reads
each bucket's default encryption (GetBucketEncryption, moto here) before anything is created and
the role gets kms:Decrypt and kms:GenerateDataKey on exactly those keys; the AWS managed `aws/s3`
key needs no grant (its key policy allows the account's principals through S3).

Checked once (2026-11-28): on the code before this change the role's policy names no kms action
for the encrypted bucket (the first test fails at `kms` below).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("moto")

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)


@pytest.fixture
def account(monkeypatch):
    import boto3
    from moto import mock_aws

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        session = boto3.session.Session(region_name="us-east-1")
        s3, kms = session.client("s3"), session.client("kms")
        key = kms.create_key(Description="data key")["KeyMetadata"]
        kms.create_alias(AliasName="alias/data", TargetKeyId=key["KeyId"])
        for bucket, rule in (("cmk-bkt", {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": key["Arn"]}),
                             ("alias-bkt", {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": "alias/data"}),
                             ("managed-bkt", {"SSEAlgorithm": "aws:kms"}),
                             ("plain-bkt", {"SSEAlgorithm": "AES256"})):
            s3.create_bucket(Bucket=bucket)
            s3.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration={
                "Rules": [{"ApplyServerSideEncryptionByDefault": rule}]})
        s3.create_bucket(Bucket="bare-bkt")
        yield session, key["Arn"]


def _spec(reads=(), writes=(), **options):
    from gpucluster.spec import ClusterSpec

    return ClusterSpec(cloud="aws", nodes=2, name="kms40", region="us-east-1", instance_type="g5.xlarge",
                       ssh_cidr="203.0.113.7/32", reads=tuple(reads), writes=tuple(writes),
                       options=tuple(options.items()))


def test_a_bucket_with_a_customer_key_gets_its_use_in_the_nodes_role(account):
    from gpucluster.infra.aws import catalog, kms, s3

    session, arn = account
    spec, notes = catalog.with_bucket_keys(_spec(reads=["s3://cmk-bkt/train", "s3://alias-bkt/x"],
                                                 writes=["s3://plain-bkt/out"]), session)
    assert dict(spec.options)[kms.KEYS_OPTION] == arn  # the alias read back as its key's ARN, once
    assert any(arn in n for n in notes)
    doc = s3.policy_document(*s3.scopes(spec), kms_keys=kms.keys_of(dict(spec.options)[kms.KEYS_OPTION]))
    [keys] = [st for st in doc["Statement"] if st["Sid"] == "BucketKeys"]
    assert keys == {"Sid": "BucketKeys", "Effect": "Allow", "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
                    "Resource": [arn]}


def test_no_grant_for_the_aws_managed_key_sse_s3_or_no_encryption(account):
    from gpucluster.infra.aws import catalog, kms, s3

    session, _ = account
    spec, notes = catalog.with_bucket_keys(_spec(reads=["s3://managed-bkt", "s3://plain-bkt", "s3://bare-bkt"]),
                                           session)
    assert kms.KEYS_OPTION not in dict(spec.options) and notes == []
    assert not [st for st in s3.policy_document(*s3.scopes(spec))["Statement"] if st["Sid"] == "BucketKeys"]


def test_keys_given_are_kept_and_checked_and_an_unreadable_bucket_is_a_note(account):
    from gpucluster.errors import SpecError
    from gpucluster.infra.aws import catalog

    session, arn = account
    given = _spec(reads=["s3://cmk-bkt"], s3KmsKeys=arn)
    assert catalog.with_bucket_keys(given, session) == (given, [])  # given: not looked up again
    assert catalog.validate_spec(given) is not None
    with pytest.raises(SpecError, match=r"option s3KmsKeys.*'alias/data'.*KMS key ARNs"):
        catalog.validate_spec(_spec(s3KmsKeys="alias/data"))
    spec, notes = catalog.with_bucket_keys(_spec(reads=["s3://no-such-bkt"]), session)
    assert len(notes) == 1 and "no-such-bkt" in notes[0] and "--option s3KmsKeys=ARN" in notes[0]


def test_the_component_declares_the_key_statement(account):
    pytest.importorskip("pulumi_aws")
    from gpucluster.infra.aws.mock_runtime import build, unwrap

    _, arn = account
    built = build(_spec(reads=["s3://cmk-bkt/train"], s3KmsKeys=arn).replace(run_id="r20261128-150000-abc123"))
    assert built.error is None, built.error
    [pol] = built.recorder.of_type("aws:iam/rolePolicy:RolePolicy")
    doc = json.loads(unwrap(pol.inputs["policy"]))
    assert [st["Resource"] for st in doc["Statement"] if st["Sid"] == "BucketKeys"] == [[arn]]
