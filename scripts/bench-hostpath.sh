#!/usr/bin/env bash
# Measures the hostpath example: idle and peak RSS, one full conformance run,
# and `csi bench` (probe and lifecycle, 1 and 8 workers). Run as root; the
# driver runs in a private mount namespace so nothing stays mounted.
#   bash scripts/bench-hostpath.sh [seconds-per-bench] [state-fs]
# The build is the `dist` profile (how the drivers ship: size-optimised,
# LTO). state-fs: `disk` (default: the state dir under /tmp, every change
# fsynced) or `tmpfs` (the driver's own work, without the disk).
# BENCH_BIN=DIR uses DIR/examples/hostpath and DIR/csi instead of building
# (to compare builds); BENCH_RUNS lists workload:workers pairs (default
# "probe:1 probe:8 lifecycle:1 lifecycle:8"). The conformance run before
# the benchmarks is the community's csi-sanity (BENCH_SANITY, default
# ../shared/tools/csi-sanity) when it is there, else `csi sanity`.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
statefs=${2:-disk}
if [ -n "${BENCH_BIN:-}" ]; then
  bin=$BENCH_BIN
else
  cargo build --profile dist -q --example hostpath --bin csi
  bin=target/dist
fi
runs=${BENCH_RUNS:-probe:1 probe:8 lifecycle:1 lifecycle:8}
sanity=${BENCH_SANITY:-$PWD/../shared/tools/csi-sanity}
[ -x "$sanity" ] || sanity=
work=$(mktemp -d /tmp/csi-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

unshare -m --propagation private bash -s "$bin" "$work" "$secs" "$statefs" "$runs" "$sanity" <<'INNER'
set -euo pipefail
bin=$1 work=$2 secs=$3 statefs=$4 runs=$5 sanity=$6
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
if [ -n "$sanity" ]; then
  "$sanity" --csi.endpoint "$work/state/csi.sock" --csi.stagingdir "$work/stage" \
    --csi.mountdir "$work/mnt" --csi.testvolumesize $((64 << 20)) \
    --csi.testvolumeexpandsize $((128 << 20)) --ginkgo.no-color > "$work/sanity.txt" 2>&1 ||
    echo "csi-sanity FAILED; the benchmarks still run"
  end=$(date +%s%N)
  echo "csi-sanity: $(grep -Eo '[0-9]+ Passed \| [0-9]+ Failed \| [0-9]+ Pending \| [0-9]+ Skipped' "$work/sanity.txt" | tail -1)"
else
  "$bin/csi" sanity --staging-dir "$work" --target-dir "$work" --driver-log "$work/driver.log" > "$work/sanity.txt" ||
    echo "conformance run FAILED (an older build against today's checks?); the benchmarks still run"
  end=$(date +%s%N)
  tail -1 "$work/sanity.txt"
fi
echo "conformance run: $(( (end - start) / 1000000 )) ms (wall, including connection)"
for run in $runs; do
  workload=${run%%:*} workers=${run##*:}
  echo "== csi bench --workload $workload --workers $workers --duration ${secs}s"
  "$bin/csi" bench --workload "$workload" --workers "$workers" --duration "${secs}s" --no-progress --work-dir "$work/bench"
done
echo "peak RSS: $(rss VmHWM)"
echo "RSS after the runs: $(rss VmRSS)"
INNER
