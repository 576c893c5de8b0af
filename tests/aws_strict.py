"""A stricter layer over moto for the aws tests: AWS's answers where moto is kinder or silent.

THIS IS A TEST DOUBLE. `StrictSession` hands out real boto3 clients (under `moto.mock_aws`) with
botocore event hooks: for an operation with a rule, the rule sees the request's parameters and may
answer itself (a dict: the parsed response), fail the call with an AWS error code (`AwsError`), or
return None to let moto answer. Every rule a test installs names its AWS source in that test.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable

import boto3


class AwsError(Exception):
    """Raised by a rule: the call fails with this AWS error code and message (HTTP status)."""

    def __init__(self, code: str, message: str = "", status: int = 400):
        super().__init__(code)
        self.code, self.message, self.status = code, message or code, status


Rule = Callable[[dict[str, Any]], Any]


class StrictSession:
    """`session.client(name, region_name=..., config=...)` -> a moto client with the rules of that
    service (`rules[(service, Operation)]`). `calls` records (service, operation, params) of every
    call a rule saw."""

    def __init__(self, region: str = "us-east-1"):
        self.region = region
        self.real = boto3.session.Session(region_name=region)
        self.rules: dict[tuple[str, str], Rule] = {}
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def on(self, service: str, operation: str, rule: Rule) -> None:
        self.rules[(service, operation)] = rule

    def client(self, name: str, region_name: str | None = None, config: Any = None, **kw: Any) -> Any:
        client = self.real.client(name, region_name=region_name or self.region, config=config, **kw)
        events = client.meta.events

        def stash(params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
            context["strict_params"] = dict(params)

        def answer(model: Any, context: dict[str, Any], **_: Any) -> Any:
            params = context.get("strict_params", {})
            self.calls.append((name, model.name, params))
            rule = self.rules.get((name, model.name))
            if rule is None:
                return None
            try:
                parsed = rule(params)
            except AwsError as err:
                return (SimpleNamespace(status_code=err.status, headers={}, content=b""),
                        {"Error": {"Code": err.code, "Message": err.message},
                         "ResponseMetadata": {"HTTPStatusCode": err.status}})
            if parsed is None:
                return None
            return (SimpleNamespace(status_code=200, headers={}, content=b""),
                    {**parsed, "ResponseMetadata": {"HTTPStatusCode": 200}})

        events.register("before-parameter-build", stash)
        events.register("before-call", answer)
        return client

    def seen(self, service: str, operation: str) -> list[dict[str, Any]]:
        return [p for s, o, p in self.calls if (s, o) == (service, operation)]


def quota_rule(values: dict[str, float]) -> Rule:
    """GetServiceQuota for EC2 quota codes: moto 5.2.5 knows only the vpc service's quotas."""

    def rule(params: dict[str, Any]) -> dict[str, Any]:
        code = params["QuotaCode"]
        if params["ServiceCode"] != "ec2" or code not in values:
            raise AwsError("NoSuchResourceException", f"quota {code} not found")
        return {"Quota": {"ServiceCode": "ec2", "QuotaCode": code, "Value": values[code], "Unit": "None"}}

    return rule
