#!/usr/bin/env bash
# Measures the hostpath example: idle and peak RSS, one full conformance run,
# and `csi bench` (probe and lifecycle, 1 and 8 workers). Run as root; the
# driver runs in a private mount namespace so nothing stays mounted.
#   bash scripts/bench-hostpath.sh [seconds-per-bench] [state-fs]
# The build is the `dist` profile (how the drivers ship: size-optimised,
# LTO). state-fs: `disk` (default: the state dir under /tmp, every change
# fsynced) or `tmpfs` (the driver's own work, without the disk).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
statefs=${2:-disk}
cargo build --profile dist -q --example hostpath --bin csi
bin=target/dist
work=$(mktemp -d /tmp/csi-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

unshare -m --propagation private bash -s "$bin" "$work" "$secs" "$statefs" <<'INNER'
set -euo pipefail
bin=$1 work=$2 secs=$3 statefs=$4
mkdir -p "$work/state"
if [ "$statefs" = tmpfs ]; then mount -t tmpfs -o size=2g tmpfs "$work/state"; fi
export CSI_ENDPOINT=unix://$work/state/csi.sock
"$bin/examples/hostpath" --statedir "$work/state" --log warn --enable-attach > "$work/driver.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$work/state/csi.sock" ] && break; sleep 0.05; done
sleep 1
rss() { awk -v k="$1" '$1 == k":" {print $2 " kB"}' /proc/$pid/status; }
echo "idle RSS: $(rss VmRSS)"
start=$(date +%s%N)
"$bin/csi" sanity --staging-dir "$work" --target-dir "$work" --driver-log "$work/driver.log" > "$work/sanity.txt"
end=$(date +%s%N)
tail -1 "$work/sanity.txt"
echo "conformance run: $(( (end - start) / 1000000 )) ms (wall, including connection)"
for workload in probe lifecycle; do
  for workers in 1 8; do
    echo "== csi bench --workload $workload --workers $workers --duration ${secs}s"
    "$bin/csi" bench --workload "$workload" --workers "$workers" --duration "${secs}s" --no-progress --work-dir "$work/bench"
  done
done
echo "peak RSS: $(rss VmHWM)"
echo "RSS after the runs: $(rss VmRSS)"
INNER
