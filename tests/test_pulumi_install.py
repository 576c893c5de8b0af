"""The Pulumi CLI on demand: found on PATH (a user's own, new enough, wins), else installed into the
gpucluster home with the Automation API's own `PulumiCommand.install`, only after consent.

What the stand-in does, and why (sources):
- `PulumiCommand.install(root, version)` (pulumi SDK, pulumi/automation/_cmd.py, `_install_posix`)
  fetches https://get.pulumi.com/install.sh with `urllib.request.urlopen` and runs it with
  `--no-edit-path --install-root ROOT --version VERSION`; it first tries `ROOT/bin/pulumi version`
  and downloads nothing when that answers. The test serves that script on loopback and sends the
  SDK's request there through `urllib.request.install_opener` (the SDK's real code path runs).
- The script downloads https://get.pulumi.com/releases/sdk/pulumi-v<VERSION>-linux-x64.tar.gz
  (https://www.pulumi.com/docs/iac/download-install/, "Manual installation": a tarball holding a
  `pulumi/` folder of binaries) and copies them into ROOT/bin. An unknown version is a 404 and the
  script fails (curl -f), as the real one does; the tarball's `pulumi` answers `version` only.
"""

from __future__ import annotations

import http.server
import io
import os
import shutil
import sys
import tarfile
import threading
import urllib.request

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("pulumi.automation")

from gpucluster.errors import ConfigError, MissingDependency  # noqa: E402
from gpucluster.infra.pulumi import cli as pulumi_cli  # noqa: E402

PINNED = pulumi_cli.MIN_PULUMI_VERSION

INSTALL_SH = r"""#!/bin/sh
# stand-in for https://get.pulumi.com/install.sh: same options, same download, same layout
set -e
VERSION=""; ROOT="$HOME/.pulumi"
while [ $# -gt 0 ]; do
  case "$1" in
    --version) VERSION="$2"; shift ;;
    --install-root) ROOT="$2"; shift ;;
    --no-edit-path) ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
TMP=$(mktemp -d)
curl -fsSL -o "$TMP/p.tar.gz" "@BASE@/releases/sdk/pulumi-v${VERSION}-linux-x64.tar.gz"
tar -xzf "$TMP/p.tar.gz" -C "$TMP"
mkdir -p "$ROOT/bin"
cp "$TMP"/pulumi/* "$ROOT/bin/"
rm -rf "$TMP"
"""


def fake_pulumi(version: str) -> str:
    return f"""#!/bin/sh
case "$1" in
  version) echo "v{version}" ;;
  *) echo "stand-in pulumi: only 'version' is answered" >&2; exit 1 ;;
esac
"""


def tarball(version: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = fake_pulumi(version).encode()
        info = tarfile.TarInfo("pulumi/pulumi")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def get_pulumi_com(monkeypatch, tmp_path):
    """get.pulumi.com on loopback; returns the list of paths requested."""
    requested: list[str] = []
    files: dict[str, bytes] = {f"/releases/sdk/pulumi-v{PINNED}-linux-x64.tar.gz": tarball(PINNED)}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            requested.append(self.path)
            body = files.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body if body is not None else b"not found")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    files["/install.sh"] = INSTALL_SH.replace("@BASE@", base).encode()
    threading.Thread(target=server.serve_forever, daemon=True).start()

    class ToLoopback(urllib.request.BaseHandler):
        handler_order = 100  # before the default https handler

        def https_open(self, req):
            if req.host == "get.pulumi.com":
                return self.parent.open(req.full_url.replace("https://get.pulumi.com", base), timeout=10)
            return None

    urllib.request.install_opener(urllib.request.build_opener(ToLoopback()))
    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no user `pulumi` unless a test puts one there
    monkeypatch.delenv(pulumi_cli.INSTALL_SETTING, raising=False)
    if shutil.which("pulumi"):
        pytest.skip("a pulumi is installed system-wide (/usr/bin or /bin)")
    yield requested
    urllib.request.install_opener(None)
    server.shutdown()
    server.server_close()


def user_pulumi(tmp_path, monkeypatch, version: str):
    bin_dir = tmp_path / f"user-bin-{version}"
    bin_dir.mkdir()
    exe = bin_dir / "pulumi"
    exe.write_text(fake_pulumi(version))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return exe


def _cli_check(provider_for):
    """The aws provider's preflight as `run` calls it, with a stand-in account: the credential and
    quota checks pass, so what is tested is the Pulumi CLI's (install offered, or not)."""
    from gpucluster.infra.pulumi.provider import PulumiProvider
    from gpucluster.infra.registry import plugin

    prov = PulumiProvider(plugin("aws"), credentials=lambda region=None: [], cloud_checks=lambda spec: None)
    return prov.preflight


def test_with_consent_the_pinned_cli_is_installed_into_the_home_once(get_pulumi_com, capsys):
    from gpucluster.cli.common import preflight, provider_for

    with pytest.raises(pulumi_cli.PulumiCliMissing) as missing:
        pulumi_cli.load_cli(None)
    assert "--yes" in missing.value.message and pulumi_cli.INSTALL_SETTING in missing.value.message
    preflight(_cli_check(provider_for), yes=True)
    assert get_pulumi_com == ["/install.sh", f"/releases/sdk/pulumi-v{PINNED}-linux-x64.tar.gz"]
    exe = pulumi_cli.managed_root() / "bin" / "pulumi"
    assert exe.is_file() and exe.parent.parent.is_relative_to(os.environ["GPUCLUSTER_HOME"])
    cmd = pulumi_cli.load_cli(None)
    assert str(cmd.version) == PINNED and cmd.command == str(exe)
    assert pulumi_cli.cli_source(cmd).startswith("installed by gpucluster in")
    assert f"Pulumi CLI {PINNED} ready" in capsys.readouterr().err
    preflight(_cli_check(provider_for), yes=False)  # found now: nothing asked, nothing fetched again
    # what it checked is the state the ledger row records (`check_before_recording`): the home's file backend
    assert _cli_check(provider_for)() == pulumi_cli.backend_url() and pulumi_cli.backend_url().startswith("file://")
    pulumi_cli.install_cli()  # the SDK's install finds the copy and downloads nothing
    assert len(get_pulumi_com) == 2

    from gpucluster.cli.doctor import check_pulumi

    (first, *_) = check_pulumi()
    assert first["ok"] is True and "installed by gpucluster in" in first["detail"] and PINNED in first["detail"]


def test_a_new_enough_pulumi_on_path_wins_an_old_one_does_not(get_pulumi_com, tmp_path, monkeypatch):
    pulumi_cli.install_cli()
    user_pulumi(tmp_path, monkeypatch, "3.100.0")  # too old: the installed copy is used
    cmd = pulumi_cli.load_cli(None)
    assert str(cmd.version) == PINNED and pulumi_cli.cli_source(cmd).startswith("installed by gpucluster")
    user_pulumi(tmp_path, monkeypatch, "3.300.1")  # the user's own, new enough: it wins
    cmd = pulumi_cli.load_cli(None)
    assert str(cmd.version) == "3.300.1" and cmd.command == "pulumi"
    assert "user-bin-3.300.1" in pulumi_cli.cli_source(cmd)


def test_an_old_pulumi_and_no_copy_is_named_in_the_error(get_pulumi_com, tmp_path, monkeypatch):
    user_pulumi(tmp_path, monkeypatch, "3.100.0")
    with pytest.raises(pulumi_cli.PulumiCliMissing) as missing:
        pulumi_cli.load_cli(None)
    assert "version 3.100.0, older than" in missing.value.message and get_pulumi_com == []


def test_nothing_is_installed_without_consent(get_pulumi_com, monkeypatch):
    from gpucluster.cli.common import preflight, provider_for

    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    with pytest.raises(pulumi_cli.PulumiCliMissing):
        preflight(_cli_check(provider_for), yes=False)  # no terminal, no --yes, no setting
    monkeypatch.setenv(pulumi_cli.INSTALL_SETTING, "no")
    with pytest.raises(pulumi_cli.PulumiCliMissing):
        preflight(_cli_check(provider_for), yes=True)  # the setting says never
    monkeypatch.setenv(pulumi_cli.INSTALL_SETTING, "maybe")
    with pytest.raises(ConfigError) as bad:
        preflight(_cli_check(provider_for), yes=True)
    assert "'maybe'" in bad.value.message and "yes or no" in bad.value.message
    assert get_pulumi_com == [] and not pulumi_cli.managed_root().exists()
    monkeypatch.setenv(pulumi_cli.INSTALL_SETTING, "yes")
    preflight(_cli_check(provider_for), yes=False)  # the setting answers the question
    assert (pulumi_cli.managed_root() / "bin" / "pulumi").is_file()


def test_help_and_dry_run_never_install(get_pulumi_com, monkeypatch):
    from gpucluster.cli.main import main

    monkeypatch.setenv(pulumi_cli.INSTALL_SETTING, "yes")
    for argv in (["run", "--help"], ["up", "--help"], ["down", "--help"], ["doctor", "--help"],
                 ["up", "--cloud", "aws", "--nodes", "2", "--dry-run"],
                 ["run", "--cloud", "aws", "--nodes", "2", "--dry-run", "--yes"]):
        assert main(argv) == 0, argv
    assert get_pulumi_com == [] and not pulumi_cli.managed_root().exists()


def test_a_failed_download_is_a_missing_dependency_with_the_way_out(get_pulumi_com):
    with pytest.raises(MissingDependency) as err:
        pulumi_cli.install_cli("3.999.0")  # not published: the tarball is a 404, the script fails
    assert "3.999.0" in err.value.message and "get.pulumi.com | sh" in err.value.message
    assert get_pulumi_com == ["/install.sh", "/releases/sdk/pulumi-v3.999.0-linux-x64.tar.gz"]


def test_the_ledger_row_records_the_state_the_preflight_checked():
    """`check_before_recording`: the provider's preflight says which state it checked (an s3:// one with the
    bucket's region it found); the run's spec, stored with its ledger row, carries it."""
    from gpucluster.domain import Provider
    from gpucluster.lifecycle.prepare import Prepared, check_before_recording
    from gpucluster.spec import ClusterSpec

    class Checked(Provider):
        def preflight(self, spec=None):
            assert spec is not None and spec.name == "st"
            return "s3://team/state?region=eu-west-1"

    plan = Prepared(ClusterSpec(cloud="aws", nodes=1, name="st"), None, Checked(), None)
    check_before_recording(plan)
    assert plan.spec.state == "s3://team/state?region=eu-west-1"
    plan = Prepared(ClusterSpec(cloud="local", nodes=1, name="st", state="stale"), None, Provider(), None)
    check_before_recording(plan)
    assert plan.spec.state is None  # a provider without state: none recorded
