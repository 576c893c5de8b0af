"""GCP access shared by the Pulumi program, the leftover scan, `doctor`, cost and the launcher.

- `resolve_project(flag, stack_config)`: THE project resolution order, used everywhere:
  1. the `--project` flag (the spec option `project`),
  2. the stack config `gcp:project`,
  3. the environment, in pulumi-gcp's order: GOOGLE_PROJECT, GOOGLE_CLOUD_PROJECT,
     GCLOUD_PROJECT, CLOUDSDK_CORE_PROJECT (pulumi-gcp's provider docs, "Configuration"),
  4. the gcloud config file (`gcloud config set project`): `$CLOUDSDK_CONFIG` or
     ~/.config/gcloud, the configuration named by CLOUDSDK_ACTIVE_CONFIG_NAME or the file
     `active_config` (default "default"), key `project` of section `[core]` of
     `configurations/config_<name>` (gcloud's documented layout, `gcloud topic configurations`),
  5. the project of the application-default credentials (`google.auth.default()`).
  It returns `(project, source)` so every command can say where the project came from.
- `google_credentials()` / `bearer_token_hook()`: Kubernetes access without gcloud: a bearer
  token from application-default credentials (scopes cloud-platform and userinfo.email),
  refreshed before it expires.
- `classify_quota(text, spec)`: a GCP quota error (GCE's `Quota 'NVIDIA_V100_GPUS' exceeded`, GKE's
  `Insufficient regional quota to satisfy request: resource "NVIDIA_V100_GPUS" ...`) as a `QuotaError`
  with the next steps: request quota, and for a regional V100 quota another region that offers V100
  (never for a global quota such as GPUS_ALL_REGIONS).

google-auth is imported inside functions (`gpucluster --help` must not import it).
"""

from __future__ import annotations

import configparser
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal, Mapping, overload

from gpucluster.errors import GpuclusterError, ProvisionError, SpecError
from gpucluster.states import JsonObject

from . import catalog, shapes

if TYPE_CHECKING:
    from google.auth.credentials import Credentials
    from kubernetes.client import Configuration

    from gpucluster.spec import ClusterSpec

# cloud-platform for the APIs; userinfo.email so that GKE knows the caller by email, as RBAC bindings name
# users (the GKE auth plugin and client-go's gcp provider ask for both; without it GKE sees a numeric id)
SCOPES = ("https://www.googleapis.com/auth/cloud-platform", "https://www.googleapis.com/auth/userinfo.email")
# pulumi-gcp reads these, in this order, when gcp:project is not set.
PROJECT_ENV_VARS = ("GOOGLE_PROJECT", "GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT")
ADC_FIX = ("run `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS to a "
           "service-account key file)")
_PROJECT_RE = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$|^[a-z0-9.-]+:[a-z][a-z0-9-]{4,28}[a-z0-9]$")


class GcpAuthError(GpuclusterError):
    """No usable Google credentials (application-default login missing, expired or refused)."""


class QuotaError(ProvisionError):
    """A GCP quota (e.g. NVIDIA_V100_GPUS in a region) is too small for the request."""

    cause = "quota"

    def __init__(self, message: str, *, quota: str, region: str | None, regions: list[str], hint: str):
        super().__init__(message, hint=hint)
        self.quota, self.region, self.regions = quota, region, regions


# -- project ----------------------------------------------------------------------------------------
def gcloud_config_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("CLOUDSDK_CONFIG"):
        return Path(env["CLOUDSDK_CONFIG"])
    if os.name == "nt" and env.get("APPDATA"):
        return Path(env["APPDATA"]) / "gcloud"
    return Path(env.get("HOME") or Path.home()) / ".config" / "gcloud"


def gcloud_config_project(env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(project, file) from gcloud's active configuration, or None."""
    folder = gcloud_config_dir(env)
    env = os.environ if env is None else env
    name = env.get("CLOUDSDK_ACTIVE_CONFIG_NAME")
    if not name:
        try:
            name = (folder / "active_config").read_text().strip() or "default"
        except OSError:
            name = "default"
    path = folder / "configurations" / f"config_{name}"
    parser = configparser.ConfigParser()
    try:
        parser.read_string(path.read_text())
    except (OSError, configparser.Error):
        return None
    project = parser.get("core", "project", fallback="").strip()
    return (project, str(path)) if project else None


def adc_project() -> str | None:
    """The project of the application-default credentials, or None (no credentials, or none set)."""
    try:
        import google.auth

        return google.auth.default(scopes=list(SCOPES))[1] or None
    except Exception:  # noqa: BLE001 - no credentials: the caller says what to do
        return None


@overload
def resolve_project(flag: str | None = None, stack_config: str | None = None, *,
                    env: Mapping[str, str] | None = None, adc: Callable[[], str | None] | None = None,
                    required: Literal[True] = True) -> tuple[str, str]: ...
@overload
def resolve_project(flag: str | None = None, stack_config: str | None = None, *,
                    env: Mapping[str, str] | None = None, adc: Callable[[], str | None] | None = None,
                    required: bool) -> tuple[str | None, str]: ...


def resolve_project(flag: str | None = None, stack_config: str | None = None, *,
                    env: Mapping[str, str] | None = None,
                    adc: Callable[[], str | None] | None = None,
                    required: bool = True) -> tuple[str | None, str]:
    """(project, where it came from). Order: flag, stack config, env vars in pulumi-gcp's order,
    the gcloud config file, the application-default credentials' project.

    Raises SpecError (one line, naming every place looked at) when nothing names a project and
    `required`; otherwise returns (None, "none")."""
    env = os.environ if env is None else env
    candidates: list[tuple[str | None, str]] = [(flag, "--project"), (stack_config, "stack config gcp:project")]
    candidates += [(env.get(var), f"environment variable {var}") for var in PROJECT_ENV_VARS]
    for value, source in candidates:
        if value and str(value).strip():
            return _checked(str(value).strip(), source), source
    found = gcloud_config_project(env)
    if found:
        return _checked(found[0], f"gcloud config {found[1]}"), f"gcloud config {found[1]}"
    project = (adc or adc_project)()
    if project:
        return _checked(project, "application-default credentials"), "application-default credentials"
    if not required:
        return None, "none"
    raise SpecError("no GCP project: pass --project MY-PROJECT, or set gcp:project in the stack, "
                    f"or one of {', '.join(PROJECT_ENV_VARS)}, or `gcloud config set project MY-PROJECT`")


def _checked(project: str, source: str) -> str:
    if not _PROJECT_RE.match(project):
        raise SpecError(f"GCP project {project!r} (from {source}) is not allowed: a project ID is 6-30 "
                        "lowercase letters, digits and '-', starting with a letter")
    return project


# -- credentials ---------------------------------------------------------------------------------------
def google_credentials(credentials: Credentials | None = None) -> Credentials:
    """Application-default credentials with the scopes cloud-platform and userinfo.email, refreshed once
    (so a bad login fails here, as one line, not later inside the kubernetes client)."""
    try:
        import google.auth
        import google.auth.exceptions
        import google.auth.transport.requests
    except ImportError:
        from gpucluster.errors import require

        require("google.auth", "gcp")
        raise
    if credentials is None:
        try:
            credentials, _ = google.auth.default(scopes=list(SCOPES))
        except google.auth.exceptions.DefaultCredentialsError as exc:
            raise GcpAuthError(f"no Google application-default credentials ({first_line(exc)})",
                               hint=ADC_FIX) from None
    if not getattr(credentials, "valid", False):
        _refresh(credentials)
    return credentials


def credentials_found() -> str | None:
    """`Operations.credentials_found`: google.auth's application-default chain, asking no API (the
    GOOGLE_APPLICATION_CREDENTIALS file, gcloud's ADC file, the metadata server)."""
    try:
        import google.auth
        import google.auth.exceptions
    except ImportError:
        return "google-auth is not installed (pip install 'gpucluster[gcp]')"
    try:
        google.auth.default(scopes=list(SCOPES))
    except google.auth.exceptions.DefaultCredentialsError:
        return ("no Google application-default credentials (looked in GOOGLE_APPLICATION_CREDENTIALS, gcloud's "
                "application_default_credentials.json, the metadata server); " + ADC_FIX)
    return None


def _refresh(credentials: Credentials) -> None:
    import google.auth.exceptions
    import google.auth.transport.requests

    try:
        credentials.refresh(google.auth.transport.requests.Request())
    except google.auth.exceptions.GoogleAuthError as exc:
        raise GcpAuthError(f"Google credentials could not be refreshed ({first_line(exc)})",
                           hint=ADC_FIX) from None
    if not getattr(credentials, "token", None):
        raise GcpAuthError("Google credentials gave no access token", hint=ADC_FIX)


def bearer_token_hook(credentials: Credentials) -> Callable[[Configuration], None]:
    """A kubernetes `Configuration.refresh_api_key_hook`: before each request, refresh the token when
    it is missing or about to expire (google-auth's `valid` is false within its refresh margin)."""

    def hook(configuration: Configuration) -> None:
        if not getattr(credentials, "valid", False):
            _refresh(credentials)
        configuration.api_key["authorization"] = credentials.token
        configuration.api_key_prefix["authorization"] = "Bearer"

    return hook


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# -- quota -------------------------------------------------------------------------------------------
# GCE's own words (Compute Engine docs, "Resource quotas"): "Quota 'NVIDIA_V100_GPUS' exceeded. Limit:
# 0.0 in region us-central1." or "... Limit: 0.0 globally." for a project-wide quota.
_QUOTA_RE = re.compile(r"Quota '(?P<quota>[A-Z0-9_]+)' exceeded\.?\s*(?:Limit: (?P<limit>[\d.]+))?"
                       r"(?:\s*(?:in region (?P<region>[a-z]+-[a-z]+\d+)|(?P<glob>globally)))?")
# GKE's, when a node pool cannot get its VMs: 'Insufficient regional quota to satisfy request: resource
# "NVIDIA_V100_GPUS": request requires '8.0' and is short '8.0'. project has a quota of '0.0' with '0.0'
# available.' (the word before "quota" says regional or global).
_GKE_QUOTA_RE = re.compile(r"Insufficient (?:(?P<scope>regional|global|zonal) )?quota to satisfy (?:the )?request: "
                           r"resource \\?\"(?P<quota>[A-Z0-9_]+)\\?\"(?::? request requires '(?P<need>[\d.]+)' and is "
                           r"short '(?P<short>[\d.]+)'\.? project has a quota of '(?P<limit>[\d.]+)')?")


def v100_regions(spec: ClusterSpec | None = None) -> list[str]:
    """The regions offering the spec's GPU pool shape (V100 without a spec; the name is the old one)."""
    zones = catalog.pool_zones(spec) if spec is not None else catalog.DEFAULT_V100_ZONES
    return sorted({catalog.region_of(z) for z in zones})


def is_global_quota(quota: str) -> bool:
    """GPUS_ALL_REGIONS, CPUS_ALL_REGIONS, ...: counted over every region of the project."""
    return quota.endswith("_ALL_REGIONS")


@dataclass(frozen=True)
class _QuotaMatch:
    """What a quota failure's text says: GKE's words, GCE's, or only a QUOTA_EXCEEDED marker."""

    gke: re.Match[str] | None
    gce: re.Match[str] | None

    @property
    def quota(self) -> str:
        found = self.gke or self.gce
        return found.group("quota") if found else "a quota"

    @property
    def limit(self) -> str | None:
        found = self.gke or self.gce
        return found.group("limit") if found else None

    @property
    def is_global(self) -> bool:
        return is_global_quota(self.quota) or bool(self.gke and self.gke.group("scope") == "global") or bool(
            self.gce and self.gce.group("glob"))

    @property
    def need(self) -> str:
        return f", needs {self.gke.group('need')} more than is free" if self.gke and self.gke.group("short") else ""

    @property
    def asked(self) -> float:
        return float(self.gke.group("need")) if self.gke and self.gke.group("need") else 0.0


def _quota_match(text: str) -> _QuotaMatch | None:
    gke = _GKE_QUOTA_RE.search(text)
    gce = _QUOTA_RE.search(text)
    if gke is None and gce is None and "QUOTA_EXCEEDED" not in text and "quotaExceeded" not in text:
        return None
    return _QuotaMatch(gke, gce)


def _quota_region(found: _QuotaMatch, spec: ClusterSpec | None) -> str | None:
    """The region the quota is short in: the one GCE names, else the spec's (or its zone's); None for a
    global quota."""
    if found.is_global:
        return None
    region = (found.gce.group("region") if found.gce else None) or (spec.region if spec is not None else None)
    if region is None and spec is not None and spec.zone:
        region = catalog.region_of(spec.zone)
    return region


def classify_quota(text: str, spec: ClusterSpec | None = None) -> QuotaError | None:
    """A `QuotaError` for GCP quota failures (GCE "Quota 'X' exceeded", GKE "Insufficient regional quota
    to satisfy request: resource "X" ...", `QUOTA_EXCEEDED`), else None. The hint fits the quota: a
    regional V100 quota can also be met in another V100 region; a global one (..._ALL_REGIONS) cannot."""
    found = _quota_match(text or "")
    if found is None:
        return None
    quota, limit, glob = found.quota, found.limit, found.is_global
    region = _quota_region(found, spec)
    others = [] if glob or not quota.endswith("_GPUS") else [r for r in v100_regions(spec) if r != region]
    where = " (all regions)" if glob else f" in {region}" if region else ""
    msg = f"GCP quota {quota} exceeded{where}" + (f" (limit {limit}{found.need})" if limit else "")
    project = (spec.project if spec is not None else None) or "PROJECT"
    hint = quota_fix(str(project), quota, region, found.asked, others) if quota != "a quota" else (
        f"see the project's quotas: https://console.cloud.google.com/iam-admin/quotas?project={project}")
    return QuotaError(msg, quota=quota, region=region, regions=others, hint=hint)


def spec_with_project(spec: ClusterSpec, flag: str | None, *, required: bool = True,
                      stack_config: str | None = None) -> ClusterSpec:
    """The spec with the resolved GCP project (`project`, `project_source`), so the program, the tag scan
    and the ledger (the spec is stored with the run) all use the same one."""
    project, source = resolve_project(flag or spec.project, stack_config, required=required)
    if project is None:
        return spec
    if not flag and spec.project and spec.project_source:
        source = spec.project_source  # given by a stack file or a recorded run: say so, not "flag"
    return spec.replace(project=project, project_source=source)


# the console page that raises a quota (IAM & Admin > Quotas)
QUOTAS_PAGE = "https://console.cloud.google.com/iam-admin/quotas?project={project}"


def quota_fix(project: str, metric: str, region: str | None, need: float = 0.0,
              others: list[str] | None = None) -> str:
    """The console page and filter that raise one quota (IAM & Admin > Quotas); for a regional V100
    quota also the other regions that offer V100 (`others`, default: the shipped list's)."""
    where = f", region {region}" if region else ""
    fix = (f"request {f'at least {need:g} ' if need > 0 else 'more '}at {QUOTAS_PAGE.format(project=project)} "
           f"(filter: metric compute.googleapis.com/{metric.lower()}{where})")
    if not region:
        fix += "; the quota is global: another region does not help"
    gpu = next((g for g, m in shapes.QUOTA_METRICS.items() if metric in (m, "PREEMPTIBLE_" + m)), None)
    if gpu is not None or metric == "GPUS_ALL_REGIONS":
        fix += "; free-trial billing accounts cannot raise GPU quotas: upgrade the account first"
    if region and gpu is not None:
        if others is None:
            zones = catalog.DEFAULT_V100_ZONES if gpu == "V100" else [z for s in shapes.shapes_for(gpu) for z in s.zones]
            others = sorted({catalog.region_of(z) for z in zones} - {region})
        if others:
            fix += f", or use another region that offers {gpu} (--region {' / '.join(others[:6])})"
    return fix
