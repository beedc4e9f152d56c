#!/usr/bin/env bash
# cloud-block's figures for docs/benchmarks.md: create-to-published time of a
# 1 GiB ext4 volume through the driver (controller and node as two processes,
# a cloud-provider with no injected latency) against the same provider calls
# made directly over HTTP plus the same storage work on the node by hand
# (probe, mkfs, mount, bind), and a minimal direct path for reference, in
# rotating order round by round; and NodeStageVolume's p50/p90 for an
# attached device. The client is
# examples/cloud-block/examples/cloud-block-bench.rs; this script builds it and
# the driver (the dist profile, linked dynamically: its provider client resolves
# host names, so it is not built statically like hostpath by
# scripts/build-dist.sh), starts the processes in a private mount and PID
# namespace, and leaves no process, mount, loop device or file behind.
#
# Usage (root): bash scripts/bench-cloud-block.sh [rounds, default 60: single rounds vary
# widely, and with fewer the ratio of medians moves from run to run; docs/benchmarks.md]
# BENCH_BIN=DIR uses DIR/cloud-block, DIR/cloud-provider and DIR/examples/cloud-block-bench
# instead of building, to compare builds run after run (copy each build's three aside).
# BENCH_DRIVER=PATH runs PATH in the driver's place with the driver's flags, e.g.
# target/dist/examples/cloud-block-floor (built here too), the floor of the figure: the
# direct path's work served on csi-server with none of the library's rules (FLOOR_SAVES=1
# adds its node's durable saves; docs/benchmarks.md, "Session 26").
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

if [ "$(id -u)" != 0 ]; then
  echo "bench-cloud-block: needs root (loop devices and mounts)" >&2
  exit 1
fi
rounds=${1:-60}

if [ -z "${BENCH_CLOUD_BLOCK_IN_NS:-}" ]; then
  if [ -n "${BENCH_BIN:-}" ]; then
    BENCH_BIN=$(cd "$BENCH_BIN" && pwd)
    export BENCH_BIN
  else
    cargo build --quiet --profile dist -p cloud-block --bins --example cloud-block-bench \
      --example cloud-block-floor
  fi
  # Mounts vanish with the namespace; the PID namespace takes the processes
  # with it if this script is killed outright.
  exec env BENCH_CLOUD_BLOCK_IN_NS=1 unshare --mount --propagation private --pid --fork \
    --kill-child --mount-proc bash "$0" "$@"
fi

bin=${BENCH_BIN:-target/dist}
driver=${BENCH_DRIVER:-$bin/cloud-block}
work=$(mktemp -d /tmp/bench-cloud-block.XXXXXX)
pids=()
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  awk -v d="$work" 'index($5, d "/") == 1 {print $5}' /proc/self/mountinfo | sort -r |
    while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
  # Detaches what the provider left attached and removes its links.
  if [ -d "$work/cloud/state" ] && ! "$bin/cloud-provider" --cleanup --data-dir "$work/cloud" \
    --device-dir "$work/by-id" >"$work/cleanup.log" 2>&1; then
    echo "bench-cloud-block: the provider's cleanup failed:" >&2
    cat "$work/cleanup.log" >&2
  fi
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT

wait_socket() {
  for _ in $(seq 300); do
    [ -S "$1" ] && return 0
    kill -0 "$2" 2>/dev/null || { echo "bench-cloud-block: $3 exited" >&2; return 1; }
    sleep 0.1
  done
  echo "bench-cloud-block: no socket from $3" >&2
  return 1
}

mkdir -p "$work/cloud" "$work/by-id" "$work/node" "$work/paths"
export CLOUD_PROVIDER_TOKEN=bench-token
coproc provider { exec "$bin/cloud-provider" --listen 127.0.0.1:0 --data-dir "$work/cloud" \
  --device-dir "$work/by-id" --node bench-node --max-volumes-per-node 64 --log warn \
  2>"$work/provider.log"; }
pids+=("$provider_PID")
read -r -t 30 line <&"${provider[0]}"
url=${line#listening on }
"$driver" --mode controller --endpoint "unix://$work/controller.sock" \
  --provider-url "$url" --log warn 2>"$work/controller.log" &
pids+=("$!")
wait_socket "$work/controller.sock" "$!" controller
env -u CLOUD_PROVIDER_TOKEN "$driver" --mode node --endpoint "unix://$work/node.sock" \
  --nodeid bench-node --device-dir "$work/by-id" --statedir "$work/node" \
  --max-volumes-per-node 64 --log warn 2>"$work/node.log" &
pids+=("$!")
wait_socket "$work/node.sock" "$!" node

echo "bench-cloud-block: $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$bin/examples/cloud-block-bench" --provider "$url" --controller "unix://$work/controller.sock" \
  --node "unix://$work/node.sock" --node-id bench-node --device-dir "$work/by-id" \
  --work "$work/paths" --rounds "$rounds"
