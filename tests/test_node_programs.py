"""Every program that runs on a node or in a pod is a file of the package (issue 23, item 7), shipped
by content as before: compiled here (`py_compile` for Python, `bash -n` for shell), and the constants
the launchers ship are exactly those files' text."""

from __future__ import annotations

import py_compile
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = {  # module, constant -> file (relative to the repository)
    ("gpucluster.watch.launch", "_ANNOUNCE"): "gpucluster/node/node_announce.py",
    ("gpucluster.infra.ssh.launch", "PORT_PY"): "infra/ssh/node_port.py",
    ("gpucluster.infra.ssh.remote", "READY_PY"): "infra/ssh/node_ready.py",
    ("gpucluster.infra.ssh.remote", "PROCS_PY"): "infra/ssh/node_procs.py",
    ("gpucluster.watch.staging", "STAGE_PY"): "gpucluster/node/node_stage.py",
    ("gpucluster.infra.ssh.stage", "STAGE_PY"): "gpucluster/node/node_stage.py",  # the same program, over ssh
    ("gpucluster.infra.aws.user_data", "SETUP_TORCH_SCRIPT"): "infra/aws/node_setup_torch.sh",
    ("gpucluster.infra.aws.user_data", "DEADMAN_SCRIPT"): "infra/aws/node_deadman.sh",
    ("gpucluster.infra.aws.user_data", "READY_SCRIPT"): "infra/aws/node_ready.sh",
    ("gpucluster.infra.aws.user_data", "IDLE_SCRIPT"): "infra/aws/node_idle.py",
    ("gpucluster.infra.kubernetes.plan", "ENTRYPOINT"): "infra/kubernetes/pod_entry.py",
    ("gpucluster.infra.kubernetes.plan", "WAITER"): "infra/kubernetes/pod_wait.py",
    ("gpucluster.infra.kubernetes.plan", "KEEPER_PROGRAM"): "infra/kubernetes/pod_keeper.py",
    ("gpucluster.infra.kubernetes.outputs", "PACK"): "infra/kubernetes/pod_pack.py",
    ("gpucluster.infra.kubernetes.outputs", "TOUCH"): "infra/kubernetes/pod_touch.py",
    ("gpucluster.infra.gcp.idle", "WATCHER"): "infra/gcp/pod_idle.py",
}
NOT_PROGRAMS = {"gpucluster/ledger/node_output.py"}  # named node_*, but runs here (the supervisor's parser)
# shipped as files (in the ssh job bundle, infra/ssh/ship.py), not as text: name in the bundle
SHIPPED_AS_FILES = {"gpucluster/node/node_check.py": "node_check.py", "infra/aws/node_notice.py": "node_notice.py",
                    "gpucluster/node/node_pghook.py": "pghook/sitecustomize.py"}
FILES = sorted(set(PROGRAMS.values()) | set(SHIPPED_AS_FILES))


def test_every_node_program_file_is_listed():
    found = {str(p.relative_to(ROOT)) for d in ("gpucluster", "infra") for pattern in ("node_*", "pod_*")
             for p in (ROOT / d).rglob(pattern) if p.suffix in (".py", ".sh")}
    assert found - NOT_PROGRAMS == set(FILES)


@pytest.mark.parametrize("rel", sorted(SHIPPED_AS_FILES))
def test_the_files_shipped_in_the_bundle_are_the_files(rel):
    import io
    import tarfile

    from gpucluster.infra.ssh.ship import bundle

    from gpucluster.infra.contract import LaunchOptions
    from gpucluster.infra.registry import plugin

    # the aws launcher's watcher goes into the bundle it ships (the others are always in it)
    _, aws_launcher = plugin("aws").transport.make(LaunchOptions())
    with tarfile.open(fileobj=io.BytesIO(bundle(None, aws_launcher.watcher[:1]))) as tar:
        member = tar.extractfile(SHIPPED_AS_FILES[rel])
        assert member is not None and member.read() == (ROOT / rel).read_bytes()


@pytest.mark.parametrize("key", sorted(PROGRAMS), ids=lambda k: k[1])
def test_the_shipped_text_is_the_files(key):
    import importlib

    module, name = key
    assert getattr(importlib.import_module(module), name) == (ROOT / PROGRAMS[key]).read_text()


@pytest.mark.parametrize("rel", [f for f in FILES if f.endswith(".py")])
def test_python_node_programs_compile(rel, tmp_path):
    py_compile.compile(str(ROOT / rel), cfile=str(tmp_path / "x.pyc"), doraise=True)


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")
@pytest.mark.parametrize("rel", [f for f in FILES if f.endswith(".sh")])
def test_shell_node_programs_parse(rel):
    text = (ROOT / rel).read_text()
    assert text.startswith("#!/bin/")
    out = subprocess.run(["bash", "-n", str(ROOT / rel)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_no_program_is_left_in_a_string_constant():
    """No module-level string constant of the package looks like a program (several lines starting
    with an import, a shebang or `set -`), so none escapes the checks above."""
    import ast

    bad = []
    for d in ("gpucluster", "infra", "cli"):
        for path in (ROOT / d).rglob("*.py"):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and \
                        isinstance(node.value.value, str) and node.value.value.count("\n") >= 3:
                    first = node.value.value.lstrip().splitlines()[0]
                    if first.startswith(("import ", "#!", "from ")):
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert bad == []
