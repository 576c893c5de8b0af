"""Cold start of `gpucluster --help`: median of several runs (goal <= 0.15 s)."""

from __future__ import annotations

import sys

from _util import BIN, median, timed


def main(runs: int = 11) -> float:
    exe = str(BIN / "gpucluster")
    timed([exe, "--help"])  # warm the page cache once
    times = []
    for _ in range(runs):
        t, p = timed([exe, "--help"])
        assert p.returncode == 0, p.stderr
        times.append(t)
    m = median(times)
    print(f"gpucluster --help: median {m * 1000:.0f} ms over {runs} runs "
          f"(min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f}); goal <= 150 ms")
    return m


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 11)
