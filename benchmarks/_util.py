"""Helpers shared by the benchmark scripts (not tests: they print figures)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def timed(argv, env=None, cwd=None) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd)
    return time.perf_counter() - t0, proc


def fresh_home_env(**extra) -> dict:
    env = dict(os.environ, GPUCLUSTER_HOME=tempfile.mkdtemp(prefix="gpucluster-bench-"))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def median(xs):
    return statistics.median(xs)


def last_json(text: str) -> dict:
    return json.loads(text[text.index("{"):])
