"""Buckets encrypted with a customer managed KMS key (issue 40 item 12).

A bucket whose default encryption is SSE-KMS with a customer managed key serves and stores objects
only for a caller that may also use that key: GetObject needs `kms:Decrypt`, PutObject needs
`kms:GenerateDataKey` (and `kms:Decrypt` for multipart uploads) on the key ("Using server-side
encryption with AWS KMS keys (SSE-KMS)", S3 User Guide: "to upload ... you need kms:GenerateDataKey",
"to download ... you need kms:Decrypt"). Without them the nodes' role gets AccessDenied from S3 on
objects its S3 policy allows. The AWS managed key `aws/s3` needs no IAM grant: its key policy lets
every principal of the account use it through S3.

`bucket_keys(buckets, session)` reads each bucket's default encryption (GetBucketEncryption) before
anything is created and returns the customer managed key ARNs to grant (an alias or a bare key id is
resolved with DescribeKey) and notes for what it could not read. `statement(arns)` is the policy
statement the nodes' role gets for them. Imports boto3 only when called.
"""

from __future__ import annotations

from typing import Iterable

from gpucluster.states import JsonObject

from .sdk import AwsSession

KEYS_OPTION = "s3KmsKeys"  # the key ARNs, comma-separated (filled in by `prepare`; a stack may give them)
AWS_MANAGED_ALIAS = "alias/aws/s3"


def bucket_keys(buckets: Iterable[str], session: AwsSession) -> tuple[list[str], list[str]]:
    """(customer managed key ARNs the buckets' default encryption uses, notes)."""
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    arns: list[str] = []
    notes: list[str] = []
    # a plan waits on this: an unreachable endpoint is a note in seconds, not botocore's minutes of retries
    s3 = session.client("s3", config=Config(connect_timeout=5, read_timeout=10, retries={"max_attempts": 2}))
    for bucket in sorted(set(buckets)):
        try:
            rules = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"]
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code != "ServerSideEncryptionConfigurationNotFoundError":
                notes.append(f"s3://{bucket}: its default encryption could not be read ({code or exc}); if it uses a "
                             f"customer managed KMS key, give its ARN: --option {KEYS_OPTION}=ARN")
            continue
        except BotoCoreError as exc:
            notes.append(f"s3://{bucket}: its default encryption could not be read ({exc})")
            continue
        for rule in rules:
            default = rule.get("ApplyServerSideEncryptionByDefault") or {}
            if not str(default.get("SSEAlgorithm", "")).startswith("aws:kms"):
                continue
            key = default.get("KMSMasterKeyID")
            if not key or key.endswith(AWS_MANAGED_ALIAS):
                continue  # the AWS managed key: usable through S3 by the account's principals
            arn = _key_arn(key, bucket, session, notes)
            if arn and arn not in arns:
                arns.append(arn)
    return arns, notes


def _key_arn(key: str, bucket: str, session: AwsSession, notes: list[str]) -> str | None:
    """The key ARN IAM needs (a policy on an alias ARN does not cover the key it names)."""
    if key.startswith("arn:") and ":key/" in key:
        return key
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        region = session.client("s3").get_bucket_location(Bucket=bucket).get("LocationConstraint") or "us-east-1"
        return str(session.client("kms", region_name=region).describe_key(KeyId=key)["KeyMetadata"]["Arn"])
    except (ClientError, BotoCoreError) as exc:
        notes.append(f"s3://{bucket} is encrypted with the KMS key {key}, whose ARN could not be read ({exc}); "
                     f"give it: --option {KEYS_OPTION}=arn:aws:kms:REGION:ACCOUNT:key/ID")
        return None


def keys_of(value: str | None) -> list[str]:
    """The option's key ARNs (comma-separated)."""
    return [k.strip() for k in str(value or "").split(",") if k.strip()]


def statement(arns: Iterable[str]) -> JsonObject | None:
    """The nodes' role statement for the buckets' keys, or None without any."""
    keys = sorted(set(arns))
    if not keys:
        return None
    return {"Sid": "BucketKeys", "Effect": "Allow", "Action": ["kms:Decrypt", "kms:GenerateDataKey"], "Resource": keys}
