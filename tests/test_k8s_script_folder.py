"""The Kubernetes launchers ship a local script's folder in a ConfigMap (at most 1 MiB). Found in
this session's own dry runs from a busy folder (/tmp, 2.3 GB): every file was read into memory
before the size was checked, and a file removed between the listing and the read (another
process's temporary file) ended the dry run with a FileNotFoundError traceback."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

from gpucluster.errors import LaunchError  # noqa: E402
from gpucluster.infra.kubernetes import plan as k8s_plan  # noqa: E402


def _project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "util.py").write_text("X = 1\n")
    return tmp_path


def test_a_folder_over_the_bound_is_refused_before_any_file_is_read(tmp_path):
    project = _project(tmp_path)
    with open(project / "weights.bin", "wb") as f:
        f.truncate(64 * 2**20)  # 64 MiB, sparse: cheap to make, costly to read
    tracemalloc.start()
    try:
        with pytest.raises(LaunchError, match=r"takes 67108\d+ bytes, over the 1000000 bytes"):
            k8s_plan._ship_user_script(["train.py"], project)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, f"{peak} bytes held while deciding to refuse"


def test_a_file_removed_after_the_listing_is_left_out(tmp_path, monkeypatch):
    project = _project(tmp_path)
    listed = k8s_plan._folder_files(project)
    (project / "util.py").unlink()  # another process's file, gone between listing and reading
    monkeypatch.setattr(k8s_plan, "_folder_files", lambda folder: listed)
    program, files, _ = k8s_plan._ship_user_script(["train.py"], project)
    assert [path for _, path, _ in files] == ["user/train.py"]
    assert program[0].endswith("/train.py")


def test_a_file_that_cannot_be_read_is_one_line_naming_it(tmp_path, monkeypatch):
    project = _project(tmp_path)
    listed = k8s_plan._folder_files(project)
    os.unlink(project / "util.py")
    os.mkdir(project / "util.py")  # open() fails with EISDIR (tests run as root: EACCES cannot be staged)
    monkeypatch.setattr(k8s_plan, "_folder_files", lambda folder: listed)
    with pytest.raises(LaunchError, match=r"util\.py cannot be read \(Is a directory\)") as err:
        k8s_plan._ship_user_script(["train.py"], project)
    assert "\n" not in str(err.value)
