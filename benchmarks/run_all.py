"""Run every benchmark and print its figures (make bench)."""

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

for name in ("cli_start", "local_overhead", "log_throughput", "scaling", "aws_program", "outputs_copy", "health_check",
             "recovery", "failover"):
    try:
        mod = importlib.import_module(name)
    except ImportError as exc:
        print(f"{name}: skipped ({exc})")
        continue
    mod.main()
