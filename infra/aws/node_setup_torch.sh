#!/bin/bash
# image=base: install torch into a venv at the node's Python path. A failure leaves its step and the
# last line of that step's output in $state/setup-error, which the ready check puts in the marker.
set -u
state="${GPUCLUSTER_STATE_DIR:-/var/lib/gpucluster}"
py="${GPUCLUSTER_NODE_PYTHON:-@PYTHON@}"
venv="$(dirname "$(dirname "$py")")"
mkdir -p "$state"
rm -f "$state/setup-error"
log="$state/setup.log"
: > "$log"
fail() {
  last=$(grep -v '^[[:space:]]*$' "$log" | tail -n 1 | tr -cd '0-9A-Za-z .,:;_/=+()<>-' | cut -c1-240)
  printf '%s failed: %s\n' "$1" "${last:-no output}" > "$state/setup-error"
  exit 1
}
"$py" -c 'import torch' >/dev/null 2>&1 && exit 0
export DEBIAN_FRONTEND=noninteractive
# the venv module needs ensurepip (Ubuntu: package python3-venv). A fresh image has no package
# lists, so `apt-get install` alone answers "Unable to locate package": update them first. On first
# boot apt may be locked by unattended-upgrades: wait for the lock (apt >= 1.9.11).
if ! python3 -c 'import ensurepip' >>"$log" 2>&1; then
  apt-get -o DPkg::Lock::Timeout=600 -o Acquire::Retries=3 update -q >>"$log" 2>&1 || fail "apt-get update"
  apt-get -o DPkg::Lock::Timeout=600 install -y -q python3-venv >>"$log" 2>&1 || fail "apt-get install python3-venv"
fi
python3 -m venv "$venv" >>"$log" 2>&1 || fail "python3 -m venv $venv"
"$venv/bin/pip" install --no-cache-dir --progress-bar off torch >>"$log" 2>&1 || fail "pip install torch"
"$py" -c 'import torch' >>"$log" 2>&1 || fail "import torch after the install"
