"""`image=base`: the real user-data scripts (torch setup, then the ready check) run in a sandbox whose
apt-get, python3, pip and nvidia-smi are stand-ins that behave like a fresh Base DLAMI's.

How the stand-ins behave, and why:
- apt-get keeps package lists: `install` finds only packages a successful `update` listed, and
  answers "E: Unable to locate package NAME" (exit 100) otherwise. A fresh cloud image ships without
  package lists (Ubuntu cloud images empty /var/lib/apt/lists; cloud-init's `package_update`
  exists to run `apt-get update` at first boot: cloud-init docs, "Package update upgrade install").
  A network failure makes `update` fail with apt's "Could not resolve" message (exit 100).
- python3 is the system Python of Ubuntu without python3-venv: `import ensurepip` fails until that
  package is installed, and `-m venv` then fails with Debian's "ensurepip is not available" message
  (Debian/Ubuntu split ensurepip into python3-venv).
- pip installs torch into the venv or fails with pip's own error line ("ERROR: Could not install
  packages due to an OSError: [Errno 28] No space left on device" on a full root volume).
- The FACTS.md note on the Base DLAMI: driver, CUDA, NCCL, system Python; no PyTorch.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from gpucluster.infra.aws import user_data as boot

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

APT = r"""#!/bin/sh
echo "apt-get $*" >> "$SANDBOX/calls"
lists="$SANDBOX/apt-lists"
case " $* " in
  *" update "*)
    if [ -e "$SANDBOX/offline" ]; then
      echo "Err:1 http://us-east-1.ec2.archive.ubuntu.com/ubuntu jammy InRelease"
      echo "  Temporary failure resolving 'us-east-1.ec2.archive.ubuntu.com'"
      echo "W: Failed to fetch http://us-east-1.ec2.archive.ubuntu.com/ubuntu/dists/jammy/InRelease  Temporary failure resolving 'us-east-1.ec2.archive.ubuntu.com'" >&2
      exit 100
    fi
    mkdir -p "$lists" && touch "$lists/python3-venv"; exit 0 ;;
  *" install "*)
    for pkg in "$@"; do case "$pkg" in -*|install|*=*|DPkg*|Acquire*) ;; *)
      if [ ! -e "$lists/$pkg" ]; then echo "E: Unable to locate package $pkg" >&2; exit 100; fi
      touch "$SANDBOX/installed-$pkg" ;; esac; done; exit 0 ;;
esac
exit 0
"""

PYTHON3 = r"""#!/bin/sh
echo "python3 $*" >> "$SANDBOX/calls"
if [ "$1" = "-c" ] && [ "$2" = "import ensurepip" ]; then
  [ -e "$SANDBOX/installed-python3-venv" ] && exit 0
  echo "ModuleNotFoundError: No module named 'ensurepip'" >&2; exit 1
fi
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  if [ ! -e "$SANDBOX/installed-python3-venv" ]; then
    echo "The virtual environment was not created successfully because ensurepip is not"
    echo "available.  On Debian/Ubuntu systems, you need to install the python3-venv"
    echo "package using the following command."
    echo ""
    echo "    apt install python3.10-venv"
    exit 1
  fi
  mkdir -p "$3/bin"
  cat > "$3/bin/pip" <<PIP
#!/bin/sh
echo "pip \$*" >> "$SANDBOX/calls"
if [ -e "$SANDBOX/disk-full" ]; then
  echo "Collecting torch"
  echo "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device" >&2; exit 1
fi
touch "$3/torch-installed"
PIP
  cat > "$3/bin/python" <<PY
#!/bin/sh
[ -e "$3/torch-installed" ] || { echo "ModuleNotFoundError: No module named 'torch'" >&2; exit 1; }
echo 2.7.0
PY
  chmod +x "$3/bin/pip" "$3/bin/python"; exit 0
fi
exit 2
"""


def _sandbox(tmp_path: Path, *, offline: bool = False, disk_full: bool = False) -> tuple[dict[str, str], Path]:
    text = boot.render_user_data(cluster="demo", expected_gpus=1, max_lifetime_minutes=60, setup_torch=True)
    doc = yaml.safe_load(text)
    # the order the node runs them in: setup, then the ready check
    assert doc["runcmd"][2:] == [[boot.SETUP_TORCH_PATH], [boot.READY_SCRIPT_PATH]]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, body in (("apt-get", APT), ("python3", PYTHON3), ("nvidia-smi", "#!/bin/sh\necho 550.127.05\n")):
        (bindir / name).write_text(body)
        (bindir / name).chmod(0o755)
    for path in (boot.SETUP_TORCH_PATH, boot.READY_SCRIPT_PATH):
        (entry,) = [f for f in doc["write_files"] if f["path"] == path]
        script = tmp_path / Path(path).name
        script.write_text(entry["content"])
        script.chmod(0o755)
    if offline:
        (tmp_path / "offline").touch()
    if disk_full:
        (tmp_path / "disk-full").touch()
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "SANDBOX": str(tmp_path), "GPUCLUSTER_STATE_DIR": str(tmp_path / "state"),
           "GPUCLUSTER_NODE_PYTHON": str(tmp_path / "opt" / "pytorch" / "bin" / "python"),
           "GPUCLUSTER_READY_TRIES": "1", "HOME": str(tmp_path)}
    return env, tmp_path


def _boot(env: dict[str, str], where: Path) -> dict:
    """cloud-init's runcmd: each command in turn, a failing one does not stop the next."""
    subprocess.run([str(where / Path(boot.SETUP_TORCH_PATH).name)], env=env, timeout=30)
    subprocess.run([str(where / Path(boot.READY_SCRIPT_PATH).name)], env=env, check=True, timeout=30)
    return json.loads((where / "state" / "ready").read_text())


def _calls(where: Path) -> list[str]:
    return (where / "calls").read_text().splitlines()


def test_a_fresh_base_image_updates_the_package_lists_first_and_gets_torch(tmp_path):
    env, where = _sandbox(tmp_path)
    marker = _boot(env, where)
    assert marker["ok"] is True and marker["torch"] == "2.7.0" and marker["error"] == "", marker
    apt = [c for c in _calls(where) if c.startswith("apt-get")]
    assert len(apt) == 2 and " update" in apt[0] and "install -y -q python3-venv" in apt[1]
    assert "DPkg::Lock::Timeout=600" in apt[1]  # first boot: unattended-upgrades may hold the lock
    assert any(c.startswith("pip install --no-cache-dir") and c.endswith(" torch") for c in _calls(where))
    assert not (where / "state" / "setup-error").exists()


def test_an_offline_node_reports_the_apt_error_in_the_ready_marker(tmp_path):
    env, where = _sandbox(tmp_path, offline=True)
    marker = _boot(env, where)
    assert marker["ok"] is False and marker["gpus"] == 1
    assert marker["error"].startswith("torch setup: apt-get update failed: W: Failed to fetch"), marker["error"]
    assert "Temporary failure resolving" in marker["error"]
    assert not any(c.startswith("pip") for c in _calls(where))  # nothing after the failed step


def test_a_failed_pip_install_is_named_with_pips_own_error(tmp_path):
    env, where = _sandbox(tmp_path, disk_full=True)
    marker = _boot(env, where)
    assert marker["ok"] is False
    assert marker["error"] == ("torch setup: pip install torch failed: ERROR: Could not install packages due to an "
                               "OSError: Errno 28 No space left on device"), marker["error"]


def test_an_image_that_has_torch_already_installs_nothing(tmp_path):
    env, where = _sandbox(tmp_path)
    venv = where / "opt" / "pytorch"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\necho 2.6.0\n")
    (venv / "bin" / "python").chmod(0o755)
    marker = _boot(env, where)
    assert marker["ok"] is True and marker["torch"] == "2.6.0"
    assert not (where / "calls").exists() or not any(c.startswith(("apt-get", "pip")) for c in _calls(where))


def test_the_scripts_are_valid_bash():
    for name in ("node_setup_torch.sh", "node_ready.sh"):
        path = Path(boot.__file__).parent / name
        assert subprocess.run(["bash", "-n", str(path)], capture_output=True, env=dict(os.environ)).returncode == 0
