"""A real S3 API on loopback for tests: moto's server mode (`moto.server.ThreadedMotoServer`, an
HTTP server speaking the S3 REST protocol, so boto3, botocore and the AWS CLI talk to it over
TCP as they would to AWS). Processes are pointed at it with the standard endpoint variable
AWS_ENDPOINT_URL_S3 ("Service-specific endpoints",
https://docs.aws.amazon.com/sdkref/latest/guide/feature-ss-endpoints.html) and dummy
credentials; moto does not enforce IAM policies, so scoping is tested on the policy document."""

from __future__ import annotations

import hashlib
import os
import urllib.request
from pathlib import Path

import pytest


class S3Server:
    def __init__(self, server, url: str):
        self.server, self.url = server, url

    @property
    def env(self) -> dict[str, str]:
        """What a process (or a fake node's sshd `SetEnv`) needs to use this S3."""
        return {"AWS_ENDPOINT_URL_S3": self.url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.url, aws_access_key_id="testing",
                            aws_secret_access_key="testing", region_name="us-east-1")

    def put_tree(self, bucket: str, prefix: str, root: Path) -> dict[str, str]:
        """Upload every file under root to bucket/prefix/; {relative path: sha256}."""
        s3, want = self.client(), {}
        for p in sorted(root.rglob("*")):
            if p.is_file():
                rel = p.relative_to(root).as_posix()
                s3.put_object(Bucket=bucket, Key=f"{prefix}/{rel}", Body=p.read_bytes())
                want[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        return want

    def sha256(self, bucket: str, key: str) -> str:
        return hashlib.sha256(self.client().get_object(Bucket=bucket, Key=key)["Body"].read()).hexdigest()

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


@pytest.fixture
def s3_server():
    pytest.importorskip("flask", reason="moto[server] is not installed (pip install 'moto[server,s3]')")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    # moto's state lives in this process, shared by every server: start each test empty
    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"), timeout=30).read()
    yield S3Server(server, url)
    server.stop()


def node_env(s3: S3Server) -> dict[str, str]:
    return {**os.environ, **s3.env}
