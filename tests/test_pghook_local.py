"""Whether a rank joined a process group (issue 46 item 2) on the local backend, with real torchrun
processes: a 2-node run of a script that exits 0 without joining one is SUCCEEDED with the warning
in the report, `show` and `show --json`; one that joins a gloo group has none, and the sitecustomize
on its own PYTHONPATH (--env) still runs under the hook (tests/test_pghook.py: the hook itself)."""

from __future__ import annotations

import pytest

from conftest import needs_torch, run_cli
from gpucluster.ledger.store import Ledger
from pg_scripts import WARNING, check_no_group, scripts, shown

pytestmark = [needs_torch, pytest.mark.slow]


def _last(home) -> str:
    return Ledger(home / "ledger.sqlite3").list_runs()[0].id


def test_no_rank_joined_is_a_warning_on_a_succeeded_run(home, tmp_path):
    folder = scripts(tmp_path)
    r = run_cli("run", "--cloud", "local", "--nodes", "2", "--", "python", "no_group.py", cwd=folder)
    check_no_group(r, _last(home))


def test_a_group_joined_is_no_warning_and_a_users_sitecustomize_still_runs(home, tmp_path):
    folder = scripts(tmp_path)
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("MARK = 'mine'\n")
    r = run_cli("run", "--cloud", "local", "--nodes", "2", "--env", f"PYTHONPATH={own}", "--", "python", "group.py",
                cwd=folder)
    assert r.returncode == 0, r.stdout + r.stderr
    assert WARNING not in " ".join(r.stdout.split())
    text, record = shown(_last(home))
    assert WARNING not in text and not any(w.startswith(WARNING) for w in record["warnings"])
    assert {k: v for k, v in record["metrics"].items() if k.startswith("pg_")} \
        == {"pg_ranks": 2, "pg_hooked": 2, "pg_world_size": 2}
    lines = [ln for n in record["node_results"] for ln in n["last_lines"]]
    assert lines.count("user sitecustomize: mine") == 2 and "joined 0 of 2" in lines and "joined 1 of 2" in lines
