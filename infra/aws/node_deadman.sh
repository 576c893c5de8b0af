#!/bin/sh
state="${GPUCLUSTER_STATE_DIR:-/var/lib/gpucluster}"
mkdir -p "$state"
[ -s "$state/deadline" ] || echo $(( $(date +%s) + 60 * @LIFETIME@ )) > "$state/deadline"
left=$(( ( $(cat "$state/deadline") - $(date +%s) + 59 ) / 60 ))
if [ "$left" -le 0 ]; then
  exec shutdown -P now "gpucluster: max lifetime of @LIFETIME@ minutes reached"
fi
exec shutdown -P "+$left" "gpucluster dead-man switch: max lifetime @LIFETIME@ minutes"
