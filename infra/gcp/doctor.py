"""`gpucluster doctor --cloud gcp`: credentials, the project and where it came from, the
prerequisites of a run of a given shape (the checks of `preflight.py`), and the Kubernetes auth path.

Above `access` (credentials, project) and `preflight` (APIs, billing, quotas): neither imports
this module, so the three import one way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpucluster.errors import GpuclusterError, SpecError
from gpucluster.spec import ClusterSpec
from gpucluster.states import JsonObject

from . import access, catalog, preflight

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

    from .preflight import BillingClient, GoogleApi


def doctor_checks(flag: str | None = None, region: str | None = None, *, nodes: int | None = None,
                  instance_type: str | None = None, spot: bool = False, credentials: Credentials | None = None,
                  google: GoogleApi | None = None, billing: BillingClient | None = None) -> list[JsonObject]:
    """`gpucluster doctor --cloud gcp`: application-default credentials, the project (and where it came
    from), the prerequisites of a run of the given shape (default: the default run's, 2 x n1-standard-4
    + 1 V100 in us-central1): the APIs, billing and quotas a run's preflight checks
    (`infra/gcp/preflight.py`), and the Kubernetes auth path (a bearer token minted from those
    credentials, as the launcher does). Each: {check, ok (True/False/None), detail, fix}."""
    def check(name: str, ok: bool | None, detail: str, fix: str = "") -> JsonObject:
        return {"check": name, "ok": ok, "detail": detail, "fix": fix}

    checks = []
    try:
        creds = access.google_credentials(credentials)
        who = getattr(creds, "service_account_email", None) or getattr(creds, "account", None) or type(creds).__name__
        checks.append(check("gcp application-default credentials", True, f"usable ({who})"))
    except access.GcpAuthError as exc:
        creds = None
        checks.append(check("gcp application-default credentials", False, exc.message, exc.hint or access.ADC_FIX))
    except GpuclusterError as exc:  # google-auth not installed
        creds = None
        checks.append(check("gcp application-default credentials", False, exc.message, exc.hint or ""))
    try:
        project, source = access.resolve_project(flag, None, adc=(lambda: None) if creds is None else None)
        checks.append(check("gcp project", True, f"{project} (from {source})"))
    except SpecError as exc:
        project = None
        checks.append(check("gcp project", False, exc.message.split(": ", 1)[0],
                            "pass --project MY-PROJECT or `gcloud config set project MY-PROJECT`"))
    region = region or catalog.region_of(catalog.DEFAULT_ZONE)
    spec = ClusterSpec(cloud="gcp", nodes=nodes or 2, region=region, instance_type=instance_type, spot=bool(spot),
                       project=project)
    name = "gcp run shape"
    try:
        catalog.validate_spec(spec)
        shape = preflight.need_line(preflight.needs(spec))
    except SpecError as exc:
        checks.append(check(name, False, exc.message, "give an N1 machine type and a region that offers V100"))
        shape = None
    if shape is not None and (creds is None or project is None):
        checks.append(check(name, None, f"not checked ({shape}): needs credentials and a project"))
    elif shape is not None:
        checks.append(check(name, True, f"the checks below are for {shape}"))
        try:
            checks += preflight.checks(spec, google=google, billing=billing, credentials=creds)
        except Exception as exc:  # noqa: BLE001 - the REST session could not be made: said, not passed
            checks.append(check(name, None, f"not checked: {access.first_line(exc)}"))
    if creds is None:
        checks.append(check("kubernetes auth (bearer token from ADC)", False, "no credentials to make a token",
                            access.ADC_FIX))
    else:
        token = getattr(creds, "token", None)
        ok = bool(token)
        checks.append(check("kubernetes auth (bearer token from ADC)", ok,
                            "a token was minted; gpucluster needs no gcloud or gke-gcloud-auth-plugin" if ok
                            else "no token", "" if ok else access.ADC_FIX))
    return checks
