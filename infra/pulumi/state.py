"""Where the Pulumi state of gpucluster's stacks lives, and how its secrets are encrypted.

The default is a file backend in the gpucluster home (`<home>/pulumi/state`): personal, on this
machine. A team points gpucluster at a state it shares, one of Pulumi's own self-managed backends
("State and backends", Pulumi docs): `s3://BUCKET[/PREFIX]`, `gs://BUCKET[/PREFIX]`,
`azblob://CONTAINER` or `file://PATH` (a shared file system). Then `status` and `down` on any
machine find and destroy a stack through Pulumi, not only by tag. Chosen, first found wins:

  --state URL (run, up, down, status, sweep; sets GPUCLUSTER_STATE for the command)
  GPUCLUSTER_STATE=URL
  "state" in $GPUCLUSTER_HOME/config.json
  PULUMI_BACKEND_URL (a user's own Pulumi login)

Secrets in a shared state cannot use the home's generated passphrase file (no teammate has it):
they need a passphrase the team shares, from PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE,
or a KMS key (GPUCLUSTER_SECRETS_PROVIDER, or "secrets_provider" in config.json: awskms://...,
gcpkms://..., azurekeyvault://..., hashivault://...). `check_secrets` says so before anything is
created (exit 2 with the fix). Pulumi decrypts a stack's state with the secrets provider recorded
in the state itself, so another machine needs only the same passphrase or access to the same key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from gpucluster.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from gpucluster.infra.pulumi.objects import S3Client

STATE_ENV = "GPUCLUSTER_STATE"
SECRETS_ENV = "GPUCLUSTER_SECRETS_PROVIDER"
SCHEMES = ("s3://", "gs://", "azblob://", "file://")
KMS_SCHEMES = ("awskms://", "gcpkms://", "azurekeyvault://", "hashivault://")
STATE_FORMS = "s3://BUCKET[/PREFIX], gs://BUCKET[/PREFIX], azblob://CONTAINER or file:///ABSOLUTE/PATH"


class StateSecretsMissing(ConfigError):
    """A shared state whose secrets could not be read by a teammate (no team passphrase, no KMS key)."""


def parse_state(url: str, what: str = "--state") -> str:
    """A self-managed Pulumi backend URL, checked for form (nothing is contacted); UsageError naming it."""
    text = str(url or "").strip()
    scheme = next((s for s in SCHEMES if text.startswith(s)), None)
    rest = text[len(scheme):] if scheme else ""
    if scheme is None or not rest.strip("/"):
        raise UsageError(f"{what} {url!r} is not allowed: {STATE_FORMS} (Pulumi's self-managed backends)")
    if scheme == "file://" and not rest.startswith("/"):
        raise UsageError(f"{what} {url!r} is not allowed: a file:// state needs an absolute path, e.g. file:///srv/state")
    if any(c.isspace() for c in text):
        raise UsageError(f"{what} {url!r} is not allowed: no spaces ({STATE_FORMS})")
    return text


def parse_secrets_provider(value: str, what: str = SECRETS_ENV) -> str:
    text = str(value or "").strip()
    if text == "passphrase" or any(text.startswith(s) and len(text) > len(s) for s in KMS_SCHEMES):
        return text
    raise UsageError(f"{what} {value!r} is not allowed: passphrase, or a key URL: {', '.join(KMS_SCHEMES)} "
                     "(e.g. awskms://alias/team-pulumi?region=us-east-1)")


def chosen() -> tuple[str | None, str]:
    """(the state URL chosen, where it came from), or (None, "") for the home's own file backend."""
    from gpucluster.home import setting

    env = os.environ.get(STATE_ENV, "").strip()
    if env:
        return parse_state(env, STATE_ENV), STATE_ENV
    from gpucluster.plan.userconfig import config_path, load_config

    configured = load_config().top.get("state")  # the user config file (docs/tasks.md)
    if configured:
        return parse_state(str(configured), f"{config_path()} state"), str(config_path())
    configured = setting("state")  # the home's own settings
    if configured:
        return parse_state(configured, "config.json state"), "config.json"
    if os.environ.get("PULUMI_BACKEND_URL"):
        return os.environ["PULUMI_BACKEND_URL"], "PULUMI_BACKEND_URL"
    return None, ""


def pulumi_dir() -> Path:
    """The home's Pulumi folder (its own state, the managed CLI), made when missing."""
    from gpucluster.home import home_dir

    return _folder(home_dir() / "pulumi")


def _folder(path: Path) -> Path:
    """`path` made (parents too) as a folder; one line (ConfigError, exit 2) when it cannot be."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # e.g. $GPUCLUSTER_HOME/pulumi is a file
        raise ConfigError(f"Pulumi state folder {str(path)!r} cannot be created ({exc.strerror or exc}); "
                          f"{str(path.parent)!r} must hold a folder there that you can write") from None
    return path


def home_state() -> str:
    return _folder(pulumi_dir() / "state").resolve().as_uri()  # a file in the way: one line, exit 2


# s3 state bucket -> its region, found by `check_state_region` (HeadBucket) for a URL that names none
_BUCKET_REGIONS: dict[str, str] = {}


def _bucket(url: str) -> str:
    return url[len("s3://"):].split("?", 1)[0].split("/", 1)[0]


def _names_region(url: str) -> bool:
    from urllib.parse import parse_qs, urlsplit

    query = parse_qs(urlsplit(url).query)
    return bool(query.get("region") or query.get("endpoint"))


def with_region(url: str) -> str:
    """An `s3://` state URL with the bucket's region (`?region=R`, Pulumi's S3 backend URL form, "State
    and backends") when it names none and `check_state_region` found it; any other URL as it is."""
    if not url.startswith("s3://") or _names_region(url) or _bucket(url) not in _BUCKET_REGIONS:
        return url
    return f"{url}{'&' if '?' in url else '?'}region={_BUCKET_REGIONS[_bucket(url)]}"


def state_url() -> str:
    url, _ = chosen()
    return with_region(url) if url else home_state()


def bucket_region(bucket: str, client: object = None) -> tuple[str | None, str]:
    """(the S3 bucket's region, '') from HeadBucket's `x-amz-bucket-region`, which S3 sends also with a
    301 (the bucket is in another region) or a 403 (S3 API reference, HeadBucket: "BucketRegion"), or
    (None, why not)."""
    try:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        return None, "boto3 is not installed"
    s3: S3Client = client or boto3.client("s3", region_name="us-east-1")
    try:
        resp = s3.head_bucket(Bucket=bucket)
    except ClientError as exc:
        resp = exc.response
        code = str(resp.get("Error", {}).get("Code", ""))
        if code in ("404", "NoSuchBucket", "NotFound"):
            return None, f"no bucket {bucket!r} (HeadBucket: 404)"
        region = (resp.get("ResponseMetadata", {}).get("HTTPHeaders") or {}).get("x-amz-bucket-region")
        return (region, "") if region else (None, f"HeadBucket: {code or exc}")
    except BotoCoreError as exc:
        return None, f"HeadBucket: {exc}"
    region = resp.get("BucketRegion") or (resp.get("ResponseMetadata", {}).get("HTTPHeaders") or {}).get(
        "x-amz-bucket-region")
    return (str(region), "") if region else (None, "HeadBucket named no region")


def check_state_region(client: object = None) -> None:
    """Before anything is created: an `s3://` state that names no region gets its bucket's, or is refused
    with the fix. Pulumi's S3 backend needs one: without it, or with another than the bucket's, it fails
    (MissingRegion when the environment has none; a redirect when the bucket is elsewhere)."""
    url, source = chosen()
    if not url or not url.startswith("s3://") or _names_region(url) or _bucket(url) in _BUCKET_REGIONS:
        return
    region, why = bucket_region(_bucket(url), client)
    if region is None:
        raise UsageError(f"the Pulumi state {url} (from {source}) names no region and the bucket's could not be "
                         f"found ({why}); nothing was created: name it in the URL, e.g. "
                         f"s3://{_bucket(url)}?region=us-west-2 (the bucket's region: aws s3api get-bucket-location "
                         f"--bucket {_bucket(url)})")
    _BUCKET_REGIONS[_bucket(url)] = region


def shared() -> bool:
    """Whether the state is one other machines may share (anything but the home's own backend)."""
    return chosen()[0] is not None


def secrets_provider() -> str | None:
    """The secrets provider for new stacks: a KMS key URL, "passphrase", or None (Pulumi Cloud's own)."""
    from gpucluster.home import setting

    value = os.environ.get(SECRETS_ENV, "").strip() or (setting("secrets_provider") or "")
    if value:
        return parse_secrets_provider(value, SECRETS_ENV if os.environ.get(SECRETS_ENV, "").strip()
                                      else "config.json secrets_provider")
    return None if state_url().startswith("https://") else "passphrase"


def team_passphrase() -> bool:
    """A passphrase given in the environment (the team's), not the home's generated one."""
    return bool(os.environ.get("PULUMI_CONFIG_PASSPHRASE") or os.environ.get("PULUMI_CONFIG_PASSPHRASE_FILE"))


def check_secrets() -> None:
    """Before anything is created: a shared state's secrets need a passphrase the team shares or a
    KMS key; a missing one is exit 2 with the fix. A passphrase file that is named must be readable."""
    url, source = chosen()
    file_var = os.environ.get("PULUMI_CONFIG_PASSPHRASE_FILE")
    if file_var and not os.environ.get("PULUMI_CONFIG_PASSPHRASE"):
        path = Path(file_var).expanduser()
        if not path.is_file() or not os.access(path, os.R_OK):
            raise ConfigError(f"PULUMI_CONFIG_PASSPHRASE_FILE {file_var!r} is not a file you can read; point it "
                              "at the file holding your team's Pulumi passphrase")
    if url is None:
        return
    provider = secrets_provider()
    if provider == "passphrase" and not team_passphrase():
        raise StateSecretsMissing(
            f"the shared Pulumi state {url} (from {source}) needs a passphrase every teammate uses, and none is set; "
            "nothing was created: export PULUMI_CONFIG_PASSPHRASE=... (or PULUMI_CONFIG_PASSPHRASE_FILE=PATH), or "
            f"encrypt with a KMS key: export {SECRETS_ENV}=awskms://alias/NAME?region=REGION (or gcpkms://...)")


def describe() -> str:
    """One line: which state, from where, and how its secrets are encrypted."""
    url, source = chosen()
    if url is None:
        return f"{home_state()} (this home's own)"
    return f"{url} (from {source}; secrets: {secrets_provider()})"
