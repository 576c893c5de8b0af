"""What of a script's folder is shipped (gpucluster/plan/shipping.py), the same for ssh/aws (the tar
bundle), local (the per-node copies) and gcp (the ConfigMap): .gitignore and .gpuclusterignore as
git reads them, tool folders and .pyc left out, links kept as links, the size limit's message
naming the largest files, and the plan saying what is shipped."""

from __future__ import annotations

import io
import os
import sys
import tarfile
from pathlib import Path

import pytest

from gpucluster.errors import UsageError
from gpucluster.watch.launch import JobSpec
from gpucluster.plan.shipping import MAX_SHIP_BYTES, shipment

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture
def project(tmp_path):
    root = tree(tmp_path / "proj", {
        "train.py": "print('hi')\n",
        "model.pt": "weights",
        "keep.pt": "small",
        "wandb/run-1/log.txt": "x",
        "data/shard-0.bin": "d",
        "sub/data/notes.txt": "not the top data folder",
        "sub/.gitignore": "!keep2.pt\nscratch/\n",
        "sub/keep2.pt": "taken back by a deeper file",
        "sub/scratch/tmp.txt": "t",
        "lib/util.py": "u",
        "lib/util.pyc": "c",
        "__pycache__/x.pyc": "c",
        ".venv/bin/python": "v",
        "big.ckpt": "resume me",
        ".gitignore": "*.pt\n!keep.pt\nwandb/\n/data\n*.ckpt\n",
        ".gpuclusterignore": "!big.ckpt\nlib/util.py\n",
    })
    os.symlink("train.py", root / "alias.py")
    return root


def test_gitignore_and_gpuclusterignore_as_git_reads_them(project):
    ship = shipment(project)
    assert sorted(e.rel for e in ship.entries) == [
        ".gitignore", ".gpuclusterignore", "alias.py", "big.ckpt", "keep.pt", "sub/.gitignore", "sub/data/notes.txt",
        "sub/keep2.pt", "train.py"]
    # model.pt, wandb/, data/, lib/util.py, sub/scratch/ (5 rules' worth); .venv, __pycache__, .pyc: tool files
    assert ship.ignored == 5
    assert [e.link for e in ship.entries if e.rel == "alias.py"] == [True]
    assert ship.summary() == (f"9 file(s), {ship.total} B (5 left out by .gitignore/.gpuclusterignore: data/, "
                              "lib/util.py, model.pt, ...)")


def test_the_repositorys_outer_ignore_files_count_but_not_one_that_ignores_the_folder_itself(tmp_path):
    repo = tree(tmp_path / "repo", {".gitignore": "*.log\nexperiments/\n", "src/train.py": "x", "src/run.log": "l",
                                    "experiments/a/train.py": "x", "experiments/a/out.log": "l"})
    (repo / ".git").mkdir()
    assert [e.rel for e in shipment(repo / "src").entries] == ["train.py"]
    # running a script from an ignored folder ships that folder (the *.log rule still holds)
    assert [e.rel for e in shipment(repo / "experiments" / "a").entries] == ["train.py"]
    # outside a repository only the folder's own files count
    (repo / ".git").rmdir()
    assert sorted(e.rel for e in shipment(repo / "src").entries) == ["run.log", "train.py"]


def test_the_size_limit_names_the_largest_files(tmp_path):
    root = tree(tmp_path / "p", {"train.py": "x" * 10})
    for name, size in (("ckpt/a.bin", MAX_SHIP_BYTES // 2), ("b.bin", MAX_SHIP_BYTES // 2 + 5)):
        (root / name).parent.mkdir(exist_ok=True)
        with open(root / name, "wb") as f:
            f.truncate(size)  # sparse
    with pytest.raises(UsageError) as exc:
        shipment(root).check_limit()
    assert "largest: b.bin (100.0 MiB), ckpt/a.bin (100.0 MiB), train.py (10 B)" in exc.value.message
    assert ".gpuclusterignore" in exc.value.message
    (root / ".gpuclusterignore").write_text("*.bin\n")
    shipment(root).check_limit()  # ignored: within the limit now


def test_a_script_left_out_by_a_rule_is_refused_before_anything(tmp_path):
    from gpucluster.infra.ssh.ship import script_shipment

    root = tree(tmp_path / "p", {"train.py": "x", ".gitignore": "*.py\n"})
    job = JobSpec("r1", command=("python", str(root / "train.py")))
    with pytest.raises(UsageError, match=r"'train.py' .* is left out by a .gitignore or .gpuclusterignore rule.*!train.py"):
        script_shipment(job)


def test_ssh_bundle_and_local_copies_ship_exactly_the_shipment(project, tmp_path, monkeypatch):
    from gpucluster.infra.local.launch import _lay_down
    from gpucluster.infra.ssh.ship import bundle

    expected = sorted(e.rel for e in shipment(project).entries)
    with tarfile.open(fileobj=io.BytesIO(bundle(project))) as tar:
        code = sorted(m.name[len("code/"):] for m in tar.getmembers() if m.name.startswith("code/"))
        assert tar.getmember("code/alias.py").issym()
    assert code == expected
    node = tmp_path / "home" / "runs" / "r1" / "nodes" / "node-0"
    _lay_down(JobSpec("r1", command=("python", "train.py")), project, node)
    copied = sorted(p.relative_to(node / "code").as_posix() for p in (node / "code").rglob("*")
                    if p.is_file() or p.is_symlink())
    assert copied == expected
    assert os.readlink(node / "code" / "alias.py") == "train.py"


def test_gpucluster_home_inside_the_folder_is_never_shipped(tmp_path, monkeypatch):
    root = tree(tmp_path / "p", {"train.py": "x", "state/ledger.sqlite3": "l"})
    monkeypatch.setenv("GPUCLUSTER_HOME", str(root / "state"))
    assert [e.rel for e in shipment(root).entries] == ["train.py"]


def test_the_plans_say_what_is_shipped(project, monkeypatch, tmp_path):
    from gpucluster.infra.local.launch import LocalLauncher
    from gpucluster.infra.ssh.launch import SshLauncher

    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path / "home"))
    job = JobSpec("r1", command=("python", str(project / "train.py")))
    local = LocalLauncher(python=sys.executable).describe(None, job)
    assert any("working folder: a copy of" in ln and "9 file(s)" in ln and "5 left out by .gitignore" in ln
               for ln in local), local
    ssh = SshLauncher().describe(None, job)
    assert any(ln.startswith(f"code: {project} -> every node: 9 file(s)") for ln in ssh), ssh


def test_gcp_configmap_ships_the_same_choice_without_hidden_files_or_links(project, monkeypatch):
    pytest.importorskip("kubernetes")
    from gpucluster.domain import Cluster
    from gpucluster.infra.kubernetes.plan import plan_job

    monkeypatch.chdir(project)
    cluster = Cluster(name="c", cloud="gcp", nodes=(), gpus_per_node=1, outputs={"nodes": 1})
    plan = plan_job(cluster, JobSpec("r1", command=("python", "train.py")), workdir=project)
    user = sorted(path for _, path, _ in plan.files if path.startswith("user/"))
    assert user == ["user/big.ckpt", "user/keep.pt", "user/sub/data/notes.txt", "user/sub/keep2.pt", "user/train.py"]
    assert any("5 left out by .gitignore/.gpuclusterignore" in n for n in plan.notes), plan.notes


def _git(repo: Path, *args: str) -> None:
    import subprocess

    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_git_tracked_files_ship_whatever_gitignore_says(tmp_path):
    """pytorch/examples' root .gitignore has a line `data`, and distributed/minGPT-ddp tracks its
    own mingpt/data/input.txt: git never applies .gitignore to a tracked file, so neither do we
    (issue 46 item 3). Untracked files under the ignored name stay out; .gpuclusterignore still
    leaves out a tracked file (the size limit's advice)."""
    repo = tree(tmp_path / "examples", {
        ".gitignore": "data\n*.bin\n",
        "distributed/minGPT-ddp/mingpt/main.py": "x",
        "distributed/minGPT-ddp/mingpt/data/input.txt": "tiny shakespeare",
        "distributed/minGPT-ddp/mingpt/data/scratch.txt": "untracked",
        "distributed/minGPT-ddp/mingpt/big.bin": "tracked but .gpuclusterignore'd",
        "distributed/minGPT-ddp/mingpt/.gpuclusterignore": "big.bin\n",
        "distributed/minGPT-ddp/mingpt/train.bin": "generated, untracked",
    })
    _git(repo, "init", "-q")
    _git(repo, "add", "-f", ".gitignore", "distributed/minGPT-ddp/mingpt/main.py",
         "distributed/minGPT-ddp/mingpt/data/input.txt", "distributed/minGPT-ddp/mingpt/big.bin")
    ship = shipment(repo / "distributed/minGPT-ddp/mingpt")
    assert sorted(e.rel for e in ship.entries) == [".gpuclusterignore", "data/input.txt", "main.py"]
    assert sorted(ship.left_out) == ["big.bin", "data/scratch.txt", "train.bin"]
    assert ship.summary().endswith("(3 left out by .gitignore/.gpuclusterignore: big.bin, data/scratch.txt, train.bin)")


def test_the_plan_names_an_argument_left_out(tmp_path, monkeypatch):
    """nanoGPT's .gitignore drops the *.bin its documented first step makes: a command that names
    one gets a note in the plan saying so and how to ship it (issue 46 item 3)."""
    from gpucluster.infra.ssh.ship import left_out_notes, script_shipment

    root = tree(tmp_path / "nanogpt", {".gitignore": "*.bin\n", "train.py": "x",
                                       "data/shakespeare/train.bin": "b", "data/shakespeare/meta.pkl": "m"})
    monkeypatch.chdir(root)
    job = JobSpec(run_id="r1", command=("python", "train.py", "--data=data/shakespeare/train.bin",
                                        "data/shakespeare/meta.pkl"))
    ship = script_shipment(job)
    assert ship is not None and ship.left_out == ["data/shakespeare/train.bin"]
    notes = left_out_notes(ship, job)
    assert len(notes) == 1 and "'data/shakespeare/train.bin', named by the command, is left out" in notes[0]
    assert "!data/shakespeare/train.bin" in notes[0]


def _job_wrote(code: Path) -> None:
    """What a job does in its working folder: a new file, a shipped file changed in place (same
    size, mtime put back), the interpreter's caches."""
    (code / "ckpt.pt").write_text("new")
    st = (code / "train.py").stat()
    (code / "train.py").write_text("print('HI')\n")
    os.utime(code / "train.py", ns=(st.st_atime_ns, st.st_mtime_ns))
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "util.cpython-311.pyc").write_bytes(b"c")


def test_local_outputs_are_what_differs_from_the_shipped_list_not_what_is_newer(tmp_path):
    """Copies keep their source's mtime: a file saved just before the run (a touched module, a
    fresh .gpuclusterignore, data copied in) came back as job output (issue 46 item 5). Now the
    node's marker holds the shipped list (size, content) and only what differs from it comes
    back; never __pycache__."""
    import time

    from gpucluster.infra.local.launch import _copy_workdir, _lay_down

    project = tree(tmp_path / "proj", {"train.py": "print('hi')\n", "datautils.py": "d", "data/mnist.bin": "m" * 100})
    soon = time.time() + 30  # saved "just now" (a clock a little ahead): newer than any back-dated mark
    for rel in ("datautils.py", "data/mnist.bin"):
        os.utime(project / rel, (soon, soon))
    node = tmp_path / "home" / "runs" / "r1" / "nodes" / "node-0"
    job = JobSpec("r1", command=("python", "train.py"))
    _lay_down(job, project, node)
    _job_wrote(node / "code")
    files, _bytes, problems = _copy_workdir(job, node, tmp_path / "back")
    got = sorted(p.relative_to(tmp_path / "back").as_posix() for p in (tmp_path / "back").rglob("*") if p.is_file())
    assert got == ["ckpt.pt", "train.py"] and files == 2 and not problems


def test_ssh_bundle_carries_the_shipped_list_and_the_node_program_uses_it(tmp_path):
    """ssh: the bundle's `shipped` marker is the shipped list; workdir.py on the node takes what
    differs from it, never __pycache__ (the .pyc came back and --resume laid them back)."""
    from gpucluster.node import workdir
    from gpucluster.infra.ssh.ship import bundle

    project = tree(tmp_path / "proj", {"train.py": "print('hi')\n", "datautils.py": "d"})
    node = tmp_path / "node"
    with tarfile.open(fileobj=io.BytesIO(bundle(project))) as tar:
        tar.extractall(node)
    later = os.stat(node / "shipped").st_mtime + 60
    os.utime(node / "code" / "datautils.py", (later, later))  # newer than the mark, yet as shipped
    _job_wrote(node / "code")
    into = tmp_path / "into"
    assert workdir.main([str(node / "code"), "--since", str(node / "shipped"), "--into", str(into)]) == 0
    assert sorted(p.relative_to(into).as_posix() for p in into.rglob("*") if p.is_file()) == ["ckpt.pt", "train.py"]
    # an earlier run's copy holding __pycache__ is not laid back by --resume
    back = tmp_path / "resume"
    (back / "__pycache__").mkdir(parents=True)
    (back / "__pycache__" / "m.pyc").write_bytes(b"c")
    (back / "snapshot.pt").write_text("s")
    dest = tmp_path / "fresh"
    dest.mkdir()
    assert workdir.lay_back(str(back), str(dest)) == (1, 1)
    assert not (dest / "__pycache__").exists()


def test_the_plan_says_where_paths_above_the_script_folder_go(tmp_path, monkeypatch):
    """Lightning's examples read and download into `<script dir>/../../Datasets`: on the nodes that
    is inside the run folder, and nothing told the user (issue 46 item 4)."""
    from gpucluster.infra.ssh.ship import left_out_notes, script_shipment

    root = tree(tmp_path / "examples" / "fabric", {
        "train.py": 'import os\nDATASETS = os.path.join(os.path.dirname(__file__), "..", "..", "Datasets")\n'})
    monkeypatch.chdir(root)
    job = JobSpec(run_id="r1", command=("python", "train.py"))
    notes = left_out_notes(script_shipment(job), job)
    assert len(notes) == 1 and "train.py names paths above its folder ('..')" in notes[0], notes
    assert "--data SRC:../NAME" in notes[0] and str(tmp_path / "examples") in notes[0]
    (root / "train.py").write_text("print('no parent paths here')\n")
    assert left_out_notes(script_shipment(job), job) == []
