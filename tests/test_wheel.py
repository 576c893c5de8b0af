"""The package as a user installs it: the sdist and the wheel built from a copy of this tree, the
wheel installed (not editable) into a fresh virtualenv outside the repository, and the CLI run
there from a directory that is not the checkout.

The clean virtualenv gets gpucluster ONLY from the wheel. Its third-party dependencies (torch,
pulumi, boto3, ...: about 2 GB) come from this test interpreter's site-packages through one .pth
file, so no download is needed; .pth files of those folders are not processed (Python reads .pth
files only in site directories), so this checkout's editable install stays invisible, and every
test asserts `gpucluster.__file__` lies inside the clean virtualenv. The `local` extra no longer
needs scikit-learn or SciPy: a second .pth file makes both unimportable there (`sys.modules[name] =
None`, the documented way to block an import), so the digits run proves it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
# source folder -> import name, as pyproject.toml's [tool.setuptools.package-dir] maps them
MAPPED = {"gpucluster": "gpucluster", "infra": "gpucluster/infra", "workloads": "gpucluster/workloads",
          "cli": "gpucluster/cli", "api": "gpucluster/api"}
SKIP = {".venv", ".git", "build", "dist", "__pycache__", ".pytest_cache", "gpucluster.egg-info"}
BLOCKED = ("sklearn", "scipy")
TIMES: dict[str, float] = {}


def _run(argv, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("timeout", 300)
    return subprocess.run(argv, capture_output=True, text=True, **kw)


def _ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"{proc.args} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout


def _build_env(tmp: Path) -> dict[str, str]:
    """An environment whose `setuptools` can build the wheel without network (>= 70.1, as
    pyproject's build-system asks); fetched from PyPI into a folder only when this interpreter's
    is older (a plain `python -m venv` brings 65.5 on 3.11)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    version = tuple(int(x) for x in re.findall(r"\d+", importlib.metadata.version("setuptools"))[:2])
    if version < (70, 1):
        target = tmp / "build-deps"
        _ok(_run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target",
                  str(target), "setuptools>=70.1"]))
        env["PYTHONPATH"] = str(target)
    return env


def _members(wheel: Path) -> dict[str, str]:
    """name -> sha256 of every file in the wheel except its RECORD (which holds the others' hashes)."""
    with zipfile.ZipFile(wheel) as zf:
        return {n: hashlib.sha256(zf.read(n)).hexdigest() for n in zf.namelist() if not n.endswith("/RECORD")}


def _dep_dirs() -> list[str]:
    """Folders this interpreter imports third-party packages from (site-packages and what their
    .pth files add), never the checkout itself."""
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    dirs += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    out: list[str] = []
    for d in dirs:
        if os.path.isdir(d) and d not in out and Path(d).resolve() != REPO:
            out.append(d)
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    t0 = time.monotonic()
    shutil.copytree(REPO, src, ignore=lambda d, names: [n for n in names if n in SKIP or n.endswith(".pyc")])
    env = _build_env(tmp)
    TIMES["build setuptools"] = time.monotonic() - t0
    t0 = time.monotonic()
    _ok(_run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; b.build_sdist(sys.argv[1])",
              str(tmp / "sdist")], cwd=src, env=env))
    (sdist,) = (tmp / "sdist").glob("gpucluster-*.tar.gz")
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check", "wheel", "--no-deps",
           "--no-build-isolation"]
    _ok(_run([*pip, "-w", str(tmp / "from-tree"), str(src)], env=env))
    _ok(_run([*pip, "-w", str(tmp / "from-sdist"), str(sdist)], env=env))
    TIMES["sdist + 2 wheels"] = time.monotonic() - t0
    (wheel,) = (tmp / "from-tree").glob("gpucluster-*.whl")
    (again,) = (tmp / "from-sdist").glob("gpucluster-*.whl")
    return {"tmp": tmp, "src": src, "sdist": sdist, "wheel": wheel, "from_sdist": again}


@pytest.fixture(scope="module")
def venv(built):
    tmp = built["tmp"]
    root = tmp / "venv"
    t0 = time.monotonic()
    _ok(_run([sys.executable, "-m", "venv", "--without-pip", str(root)]))
    python = root / "bin" / "python"
    purelib = Path(_ok(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])).strip())
    (purelib / "zz_test_deps.pth").write_text("".join(f"{d}\n" for d in _dep_dirs()))
    (purelib / "zz_block_sklearn.pth").write_text(
        f"import sys; sys.modules.update(dict.fromkeys({BLOCKED!r}))\n")
    _ok(_run([sys.executable, "-m", "pip", "-q", "--disable-pip-version-check", "--python", str(python), "install",
              "--no-deps", "--no-index", str(built["wheel"])]))
    TIMES["venv + install"] = time.monotonic() - t0
    work = tmp / "cwd"  # not the checkout: nothing here to import
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "GPUCLUSTER_"))}
    env.update(GPUCLUSTER_HOME=str(tmp / "home"), PATH=f"{root / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               COLUMNS="200")
    return {"root": root, "python": python, "gpucluster": root / "bin" / "gpucluster", "cwd": work, "env": env}


def _in_venv(v, *argv, timeout=300) -> subprocess.CompletedProcess:
    return _run([str(v["gpucluster"]), *argv], cwd=v["cwd"], env=v["env"], timeout=timeout)


def test_the_wheel_holds_every_module_and_data_file_of_the_source_tree(built):
    names = set(_members(built["wheel"]))
    expected = set()
    for folder, dest in MAPPED.items():
        for path in (REPO / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                expected.add(f"{dest}/{path.relative_to(REPO / folder).as_posix()}")
    missing = sorted(expected - names)
    assert not missing, f"in the source tree, not in the wheel: {missing}"
    extra = sorted(n for n in names - expected if ".dist-info/" not in n)
    assert not extra, f"in the wheel, not in the source tree: {extra}"
    # the ones a user meets first, named so a failure reads plainly
    for must in ("gpucluster/costing/estimate.py", "gpucluster/catalog/data/prices.json",
                 "gpucluster/infra/aws/s3_node.py", "gpucluster/infra/gcp/gcs_node.py", "gpucluster/node/reaper.py",
                 "gpucluster/workloads/data/digits.csv.gz", "gpucluster/workloads/data/DIGITS-LICENSE.txt"):
        assert must in names


def test_the_sdist_builds_the_same_wheel(built):
    assert _members(built["from_sdist"]) == _members(built["wheel"])
    with tarfile.open(built["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"pyproject.toml", "setup.py", "README.md", "workloads/data/DIGITS-LICENSE.txt"} <= names


def test_the_wheel_declares_the_extras_and_they_resolve_here(built, venv):
    """Every requirement of gpucluster[local,aws,gcp] (read from the INSTALLED metadata) is met by
    what the clean virtualenv sees, and `local` no longer pulls scikit-learn or SciPy."""
    script = """
import importlib.metadata as m, json
from packaging.requirements import Requirement
out = {}
for text in m.requires("gpucluster"):
    r = Requirement(text)
    extras = [e for e in ("", "local", "aws", "gcp") if r.marker is None or r.marker.evaluate({"extra": e})]
    try:
        have = m.version(r.name)
    except m.PackageNotFoundError:
        have = None
    out[text] = [extras, have, have is not None and r.specifier.contains(have, prereleases=True)]
print(json.dumps(out))
"""
    reqs = json.loads(_ok(_run([str(venv["python"]), "-c", script], cwd=venv["cwd"], env=venv["env"])))
    local = {t.split(";")[0].strip() for t, (extras, _, _) in reqs.items() if "local" in extras}
    assert not [t for t in local if t.lower().startswith(("scikit-learn", "scipy"))], local
    unmet = {t: have for t, (extras, have, ok) in reqs.items() if set(extras) & {"", "local", "aws", "gcp"} and not ok}
    assert not unmet, f"requirements the installed versions do not meet: {unmet}"


def test_the_cli_runs_from_the_wheel_alone(venv):
    where = _ok(_run([str(venv["python"]), "-c", "import gpucluster, sys; print(gpucluster.__file__)"],
                     cwd=venv["cwd"], env=venv["env"])).strip()
    assert Path(where).is_relative_to(venv["root"]), where
    blocked = _run([str(venv["python"]), "-c", "import sklearn"], cwd=venv["cwd"], env=venv["env"])
    assert blocked.returncode != 0  # the clean venv really lacks scikit-learn

    t0 = time.monotonic()
    assert "Usage: gpucluster" in _ok(_in_venv(venv, "--help"))
    # every command's and subcommand's --help, through the installed entry point's `main`
    script = """
import click, sys
from gpucluster.cli.main import cli, main
def walk(cmd, path):
    yield path
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd)
        for name in cmd.list_commands(ctx):
            yield from walk(cmd.get_command(ctx, name), [*path, name])
paths = list(walk(cli, []))
for p in paths:
    if main([*p, "--help"]) != 0:
        sys.exit("--help failed: " + " ".join(p))
print(len(paths), "helps")
"""
    out = _ok(_run([str(venv["python"]), "-c", script], cwd=venv["cwd"], env=venv["env"]))
    assert int(out.strip().splitlines()[-1].split()[0]) >= 15, out
    for cloud, itype in (("aws", "g5.xlarge"), ("gcp", "n1-standard-8")):
        out = _ok(_in_venv(venv, "cost", "estimate", "--cloud", cloud, "--nodes", "2", "--instance-type", itype,
                           "--hours", "1"))
        assert "$" in out, out
    assert "g5.xlarge" in _ok(_in_venv(venv, "prices"))
    TIMES["helps, estimates, prices"] = time.monotonic() - t0

    t0 = time.monotonic()
    run = _in_venv(venv, "run", "--cloud", "local", "--nodes", "2", "--workload", "digits", "--yes",
                   "--workload-args", "--epochs 3")
    out = _ok(run)
    TIMES["local digits run"] = time.monotonic() - t0
    run_id = re.search(r"\br\d{8}-\d{6}-[0-9a-f]+\b", out + run.stderr).group(0)
    assert run_id in _ok(_in_venv(venv, "runs"))
    shown = _ok(_in_venv(venv, "show", run_id))
    assert f"run {run_id} SUCCEEDED" in shown, shown

    t0 = time.monotonic()
    aws = _ok(_in_venv(venv, "run", "--cloud", "aws", "--nodes", "2", "--dry-run"))
    gcp = _ok(_in_venv(venv, "run", "--cloud", "gcp", "--nodes", "2", "--dry-run", "--project", "my-project"))
    assert re.search(r"nothing (was )?created", aws) and re.search(r"nothing (was )?created", gcp), (aws, gcp)
    TIMES["aws + gcp dry runs"] = time.monotonic() - t0
    sys.stderr.write("wheel test times: " + ", ".join(f"{k} {v:.1f} s" for k, v in TIMES.items()) + "\n")
