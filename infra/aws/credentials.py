"""How long the caller's AWS credentials last, against how long the run may need them (issue 40 item 8).

A run's teardown (`pulumi destroy`, the tag scan and the deletes by tag) needs credentials at its end:
temporary ones that expired by then (an assumed role's 1 h, SSO's role credentials, keys exported with
AWS_SESSION_TOKEN) break it, and the nodes bill until their dead-man switch. botocore refreshes some
kinds itself as they near expiry (`botocore.credentials.RefreshableCredentials`: an instance or
container role, a profile with `role_arn` that botocore assumes again from its source, web identity,
`credential_process`, SSO while its session lasts), and so does the Pulumi CLI (the AWS SDK for Go
reads the same profile). Others cannot be refreshed: keys in the environment (their expiry from
AWS_CREDENTIAL_EXPIRATION), or a session token in the credentials file. `lifetime_check` says which,
before anything is created: such credentials that end before the nodes' lifetime cap
(`max_lifetime_minutes`, raised by `prepare` to fit `--max-minutes`) plus the teardown's margin stop
the run (exit 2) with what to do.
"""

from __future__ import annotations

import datetime as dt
from gpucluster.spec import ClusterSpec
from gpucluster.states import JsonObject

from .sdk import BotoCredentials

# minutes the teardown may take after the nodes' lifetime: terminating GPU nodes (1-2 min and more),
# `pulumi destroy`, the tag scan and its deletes by tag, with their waits
TEARDOWN_MARGIN_MINUTES = 15
# botocore's credential methods (`Credentials.method`) that it refreshes by itself, and what they are
REFRESHED = {
    "iam-role": "the instance's role",
    "container-role": "the container's role",
    "assume-role": "a role botocore assumes again from its source profile",
    "assume-role-with-web-identity": "a web-identity role",
    "custom-process": "credential_process",
    "sso": "SSO, as long as its session lasts (`aws sso login`)",
}
CHECK = "aws credentials lifetime"


def _row(ok: bool | None, detail: str, fix: str = "") -> JsonObject:
    return {"check": CHECK, "ok": ok, "detail": detail, "fix": fix}


def lifetime_check(creds: BotoCredentials, spec: ClusterSpec, now: dt.datetime | None = None) -> JsonObject | None:
    """The credentials' lifetime against the run's: a failed row when they cannot be refreshed and end
    first, a note when temporary ones have no known end, else an ok row; None for long-lived keys."""
    if creds is None:
        return None
    lifetime = int(spec.max_lifetime_minutes or 0)
    need = lifetime + TEARDOWN_MARGIN_MINUTES
    method = str(getattr(creds, "method", "") or "")
    expiry = getattr(creds, "_expiry_time", None)
    if expiry is None:
        if not getattr(creds, "token", None):
            return None  # long-lived access keys
        return _row(None, f"temporary credentials ({method or 'a session token'}) whose end is not known: if they "
                          f"end before this run's teardown (up to {lifetime} + {TEARDOWN_MARGIN_MINUTES} min from now) "
                          "its nodes bill until their dead-man switch",
                    "prefer a profile botocore refreshes (role_arn with source_profile, or SSO)")
    now = now or dt.datetime.now(dt.timezone.utc)
    if expiry.tzinfo is None:
        expiry = expiry.replace(tzinfo=dt.timezone.utc)
    left = (expiry - now).total_seconds() / 60
    if method in REFRESHED:
        return _row(True, f"temporary ({REFRESHED[method]}), valid {max(left, 0):.0f} more min and refreshed as they "
                          "near expiry (botocore here, the AWS SDK in Pulumi)")
    if left >= need:
        return _row(True, f"temporary ({method}), valid {left:.0f} min: enough for up to {lifetime} min of run and "
                          f"{TEARDOWN_MARGIN_MINUTES} of teardown")
    return _row(False, f"the AWS credentials ({method}) end in {max(left, 0):.0f} min and cannot be refreshed, but this "
                       f"run may need them for {lifetime} min plus {TEARDOWN_MARGIN_MINUTES} for its teardown",
                f"use a profile that refreshes itself (role_arn with source_profile, or SSO: `aws sso login --profile P`, "
                f"export AWS_PROFILE=P), or credentials valid {need} min or more, or a shorter --max-minutes / "
                "--max-lifetime")
