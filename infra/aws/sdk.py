"""The names this backend gives boto3's objects, one per kind, so that a signature says which
service's client it takes. Imports nothing (no boto3): type names only.

Each is `Any`: boto3 builds its sessions, clients and paginators at run time from the service
models it ships (botocore's JSON), so they carry no static types, and no stub package is a
dependency of gpucluster.
"""

from __future__ import annotations

from typing import Any, Callable

AwsSession = Any  # Any: a boto3.session.Session (its clients are made at run time)
Ec2Client = Any  # Any: boto3's "ec2" client, built at run time from botocore's service model
IamClient = Any  # Any: boto3's "iam" client, built at run time
QuotasClient = Any  # Any: boto3's "service-quotas" client, built at run time
PricingClient = Any  # Any: boto3's "pricing" client, built at run time
BotoCredentials = Any  # Any: botocore's Credentials (RefreshableCredentials, ...), read as botocore sets them
BotoClient = Any  # Any: a boto3 client of any service, built at run time (a factory's answer)

# `_clients(session, region)`: a service name -> that service's client in the region
ClientFor = Callable[[str], BotoClient]
