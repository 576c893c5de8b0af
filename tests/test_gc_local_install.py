"""`gc` without --cloud on an install without a cloud's package (a local-only install): it says
what gc is for and which clouds it did not look at, instead of failing with "needs boto3" (issue 46
item 9); a cloud named with --cloud, or one this home ran on, still names the missing package."""

from __future__ import annotations

import sys

import pytest

from gpucluster.errors import MissingDependency

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def test_gc_on_a_local_only_install_says_what_it_is_for(home, monkeypatch, capsys):
    from gpucluster.cli import gc

    monkeypatch.setitem(sys.modules, "boto3", None)  # not installed: importing it raises ImportError
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "p-1")
    monkeypatch.setattr("gpucluster.lifecycle.teardown.Collection.look", lambda self: ({c: [] for c in self.backends}, []))
    gc.gc.main([], prog_name="gpucluster gc", standalone_mode=False)
    out = " ".join(capsys.readouterr().out.split())
    assert "gc finds cloud resources" in out and "not looked for on aws: its package is not installed" in out
    assert "pip install 'gpucluster[aws]'" in out and "local and ssh runs make no cloud resources" in out
    with pytest.raises(MissingDependency, match="boto3"):  # named: the user must hear what is missing
        gc.gc.main(["--cloud", "aws"], prog_name="gpucluster gc", standalone_mode=False)
