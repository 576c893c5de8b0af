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
        self.regions: list[tuple[str, str, str]] = []  # (service, operation, the client's region) of every call

    def get_credentials(self) -> Any:
        """The credentials botocore's chain finds (boto3.session.Session.get_credentials)."""
        return self.real.get_credentials()

    def on(self, service: str, operation: str, rule: Rule) -> None:
        self.rules[(service, operation)] = rule

    def client(self, name: str, region_name: str | None = None, config: Any = None, **kw: Any) -> Any:
        client = self.real.client(name, region_name=region_name or self.region, config=config, **kw)
        events = client.meta.events
        where = client.meta.region_name

        def stash(params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
            context["strict_params"] = dict(params)

        def answer(model: Any, context: dict[str, Any], **_: Any) -> Any:
            params = context.get("strict_params", {})
            self.calls.append((name, model.name, params))
            self.regions.append((name, model.name, where))
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


# -- IAM's policy simulator ---------------------------------------------------------------------------
def _listed(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


def _like(pattern: str, value: str, *, fold: bool) -> bool:
    """IAM's wildcards: `*` any run of characters, `?` one character (action names ignore case)."""
    import fnmatch

    return fnmatch.fnmatchcase(value.lower(), pattern.lower()) if fold else fnmatch.fnmatchcase(value, pattern)


def _applies(statement: dict[str, Any], action: str, resource: str, context: dict[str, list[str]]) -> bool:
    if "Action" in statement:
        hit = any(_like(p, action, fold=True) for p in _listed(statement["Action"]))
    else:
        hit = not any(_like(p, action, fold=True) for p in _listed(statement.get("NotAction")))
    if "Resource" in statement:
        hit = hit and any(_like(p, resource, fold=False) for p in _listed(statement["Resource"]))
    elif "NotResource" in statement:
        hit = hit and not any(_like(p, resource, fold=False) for p in _listed(statement["NotResource"]))
    for op, keys in (statement.get("Condition") or {}).items():
        for key, values in keys.items():
            have = context.get(key.lower(), [])
            if op == "StringEquals":
                hit = hit and any(v in _listed(values) for v in have)
            elif op == "StringLike":
                hit = hit and any(_like(p, v, fold=False) for p in _listed(values) for v in have)
            else:  # the stand-in models these two operators only; fail loudly rather than guess
                raise AssertionError(f"condition operator {op} is not modelled by the IAM simulator stand-in")
    return hit


def decide(documents: list[dict[str, Any]], action: str, resource: str = "*",
           context: dict[str, list[str]] | None = None) -> str:
    """IAM's evaluation of identity policies: an explicit Deny wins, else an Allow, else the default
    implicit deny (IAM User Guide, "Policy evaluation logic")."""
    context = context or {}
    allowed = False
    for doc in documents:
        for st in _listed(doc.get("Statement")) if isinstance(doc.get("Statement"), list) else [doc["Statement"]]:
            if _applies(st, action, resource, context):
                if st.get("Effect") == "Deny":
                    return "explicitDeny"
                allowed = True
    return "allowed" if allowed else "implicitDeny"


def identity_documents(iam: Any, arn: str) -> list[dict[str, Any]]:
    """The identity policies of a user or role, read back from moto (managed and inline)."""
    import json
    from urllib.parse import unquote

    kind, name = arn.split(":", 5)[5].split("/", 1)
    name = name.rsplit("/", 1)[-1]
    docs = []
    if kind == "user":
        attached = iam.list_attached_user_policies(UserName=name)["AttachedPolicies"]
        inline = [iam.get_user_policy(UserName=name, PolicyName=p)["PolicyDocument"]
                  for p in iam.list_user_policies(UserName=name)["PolicyNames"]]
    else:
        attached = iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"]
        inline = [iam.get_role_policy(RoleName=name, PolicyName=p)["PolicyDocument"]
                  for p in iam.list_role_policies(RoleName=name)["PolicyNames"]]
    for pol in attached:
        version = iam.get_policy(PolicyArn=pol["PolicyArn"])["Policy"]["DefaultVersionId"]
        docs.append(iam.get_policy_version(PolicyArn=pol["PolicyArn"], VersionId=version)["PolicyVersion"]["Document"])
    docs += inline
    return [json.loads(unquote(d)) if isinstance(d, str) else d for d in docs]


def simulator_rule(session: StrictSession, caller_arn: str) -> Rule:
    """iam:SimulatePrincipalPolicy, which moto 5.2.5 does not implement. Like IAM, the call itself is
    authorized first: the caller needs iam:SimulatePrincipalPolicy (else AccessDenied); then each
    action is decided against the source principal's identity policies as stored in moto, with the
    request's resource ARNs and context entries (IAM API reference, SimulatePrincipalPolicy;
    results carry EvalDecision allowed / explicitDeny / implicitDeny)."""

    def rule(params: dict[str, Any]) -> dict[str, Any]:
        iam = session.real.client("iam")
        source = params["PolicySourceArn"]
        if decide(identity_documents(iam, caller_arn), "iam:SimulatePrincipalPolicy", source) != "allowed":
            raise AwsError("AccessDenied", f"User: {caller_arn} is not authorized to perform: "
                                           f"iam:SimulatePrincipalPolicy on resource: {source}", 403)
        docs = identity_documents(iam, source)
        context = {c["ContextKeyName"].lower(): list(c["ContextKeyValues"]) for c in params.get("ContextEntries", [])}
        results = []
        for action in params["ActionNames"]:
            decisions = [decide(docs, action, res, context) for res in params.get("ResourceArns") or ["*"]]
            worst = next((d for d in ("explicitDeny", "implicitDeny") if d in decisions), "allowed")
            results.append({"EvalActionName": action, "EvalResourceName": (params.get("ResourceArns") or ["*"])[0],
                            "EvalDecision": worst})
        return {"EvaluationResults": results, "IsTruncated": False}

    return rule


def aws_managed_document(name: str) -> dict[str, Any]:
    """An AWS managed policy's document (e.g. PowerUserAccess, ReadOnlyAccess) as bundled in moto,
    which ships AWS's own policy documents (moto/iam/aws_managed_policies.py)."""
    import json

    from moto.iam.aws_managed_policies import aws_managed_policies_data

    return json.loads(aws_managed_policies_data)[name]["Document"]


def user_with(session: StrictSession, user: str, *documents: dict[str, Any]) -> Any:
    """An IAM user in moto with these identity policies and an access key; returns a StrictSession
    whose calls are made as that user (moto's STS answers with the user's ARN for its key)."""
    import json

    iam = session.real.client("iam")
    iam.create_user(UserName=user)
    for i, doc in enumerate(documents):
        arn = iam.create_policy(PolicyName=f"{user}-{i}", PolicyDocument=json.dumps(doc))["Policy"]["Arn"]
        iam.attach_user_policy(UserName=user, PolicyArn=arn)
    key = iam.create_access_key(UserName=user)["AccessKey"]
    as_user = StrictSession(session.region)
    as_user.real = boto3.session.Session(aws_access_key_id=key["AccessKeyId"],
                                         aws_secret_access_key=key["SecretAccessKey"], region_name=session.region)
    return as_user
