"""Two small scripts for the process-group hook's real runs (issue 46 item 2; tests/test_pghook_local.py,
tests/test_pghook_ssh.py): one that exits 0 without joining a group (minGPT-ddp's shape on a node with
too few GPUs), one that joins a gloo group; and the checks of what the report, `show` and `show --json`
say of them."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_cli

NO_GROUP = '''import sys
print("Unable to locate sufficient 2 gpus to run this example. Exiting.")
sys.exit(0)
'''
GROUP = '''import sitecustomize
import torch.distributed as dist
print("user sitecustomize:", getattr(sitecustomize, "MARK", None))
dist.init_process_group("gloo")
print("joined", dist.get_rank(), "of", dist.get_world_size())
dist.barrier()  # no rank leaves while another still connects its gloo mesh (tests/test_kept.py)
dist.destroy_process_group()
'''
WARNING = "warning: no rank joined the process group: did the script train?"


def scripts(tmp_path: Path) -> Path:
    """A script folder holding both (and nothing else: both ship quickly)."""
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "no_group.py").write_text(NO_GROUP)
    (folder / "group.py").write_text(GROUP)
    return folder


def shown(rid: str) -> tuple[str, dict]:
    """`show RUN` and `show RUN --json`."""
    text = run_cli("show", rid)
    assert text.returncode == 0, text.stderr
    js = run_cli("show", rid, "--json")
    assert js.returncode == 0, js.stderr
    return " ".join(text.stdout.split()), json.loads(js.stdout)


def check_no_group(r, rid: str) -> None:
    """The run of NO_GROUP: SUCCEEDED, the warning in the report, `show` and `show --json`."""
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCEEDED" in r.stdout and WARNING in " ".join(r.stdout.split())
    assert "pg_hook" not in r.stdout + r.stderr  # gpucluster's own records: not on the console
    text, record = shown(rid)
    assert WARNING in text
    assert record["status"] == "succeeded" and record["metrics"]["pg_ranks"] == 0 \
        and record["metrics"]["pg_hooked"] == 2, record["metrics"]
    assert record["warnings"][0].startswith(WARNING) and "None of its 2 ranks" in record["warnings"][0]
