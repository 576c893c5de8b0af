#!/bin/bash
set -u
py="${GPUCLUSTER_NODE_PYTHON:-@PYTHON@}"
venv="$(dirname "$(dirname "$py")")"
if ! "$py" -c 'import torch' >/dev/null 2>&1; then
  (command -v apt-get >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv) || true
  python3 -m venv "$venv" && "$venv/bin/pip" install -q torch
fi
