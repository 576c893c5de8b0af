#!/bin/bash
state="${GPUCLUSTER_STATE_DIR:-/var/lib/gpucluster}"
tries="${GPUCLUSTER_READY_TRIES:-@TRIES@}"
expected=@EXPECTED@
mkdir -p "$state"
count=0; driver=""; err=""
for attempt in $(seq 1 "$tries"); do
  if out=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1); then
    count=$(printf '%s\n' "$out" | grep -c .)
    driver=$(printf '%s\n' "$out" | head -n1 | tr -cd '0-9A-Za-z.-')
    err=""
    [ "$count" -eq "$expected" ] && break
  else
    count=0
    err=$(printf '%s' "$out" | head -n1 | tr -cd '0-9A-Za-z .:_/-')
  fi
  [ "$attempt" -lt "$tries" ] && sleep @PAUSE@
done
ok=false
[ "$count" -eq "$expected" ] && ok=true
py="${GPUCLUSTER_NODE_PYTHON:-@PYTHON@}"
torch=$("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null | tr -cd '0-9A-Za-z.+-')
if [ -z "$torch" ]; then
  ok=false
  if [ -z "$err" ] && [ -s "$state/setup-error" ]; then  # image=base: why the torch install failed
    err="torch setup: $(head -n 1 "$state/setup-error" | tr -cd '0-9A-Za-z .,:;_/=+()<>-')"
  fi
  [ -n "$err" ] || err="torch is not importable by $py"
fi
printf '{"ok": %s, "gpus": %d, "expected_gpus": %d, "driver": "%s", "torch": "%s", "error": "%s", "cluster": "@CLUSTER@", "checked_at": "%s"}\n' \
  "$ok" "$count" "$expected" "$driver" "$torch" "$err" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$state/ready.tmp"
chmod 0644 "$state/ready.tmp"
mv "$state/ready.tmp" "$state/ready"
