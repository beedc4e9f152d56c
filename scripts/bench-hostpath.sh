#!/usr/bin/env bash
# Measures the hostpath example beside the Go reference driver
# (csi-driver-host-path v1.12.1) in the same run, with the same client
# (`csi bench`), alternating the two drivers round by round: idle and peak
# RSS, one full conformance run, and `csi bench` (probe and lifecycle, 1 and
# 8 workers), and where the peak is resident (per mapping). Each ratio
# printed at the end compares figures of this run only. Run as root; the
# drivers run in a private mount and PID namespace, so nothing stays
# mounted or running, even after a failure midway.
#   bash scripts/bench-hostpath.sh [seconds-per-bench] [state-fs] [rounds]
# The build is scripts/build-dist.sh's (how the drivers ship, and what
# deploy/Dockerfile builds: the `dist` profile, size-optimised, LTO, glibc
# linked statically; in target/<host triple>/dist). state-fs: `disk`
# (default: the state dir under /tmp, every change fsynced) or `tmpfs`.
# BENCH_BIN=DIR uses DIR/hostpath (or DIR/examples/hostpath, as builds from before
# the drivers were packages put it) and DIR/csi instead of building
# (to compare builds); BENCH_RUNS lists workload:workers pairs (default
# "probe:1 probe:8 lifecycle:1 lifecycle:8"); GO_DRIVER names the Go driver
# (default ../shared/tools/hostpathplugin; without it ours runs alone). The
# conformance run before the benchmarks is the community's csi-sanity
# (BENCH_SANITY, default ../shared/tools/csi-sanity) when it is there, else
# `csi sanity`.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
statefs=${2:-disk}
rounds=${3:-2}
if [ -n "${BENCH_BIN:-}" ]; then
  bin=$(cd "$BENCH_BIN" && pwd)
else
  bin=$(bash scripts/build-dist.sh -q -p hostpath -p csi-cli --bins)
fi
runs=${BENCH_RUNS:-probe:1 probe:8 lifecycle:1 lifecycle:8}
sanity=${BENCH_SANITY:-$PWD/../shared/tools/csi-sanity}
[ -x "$sanity" ] || sanity=
go=${GO_DRIVER:-$PWD/../shared/tools/hostpathplugin}
[ -x "$go" ] || { echo "no Go driver at $go: ours runs alone, no ratio"; go=; }
work=$(mktemp -d /tmp/csi-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

unshare -m --propagation private --pid --fork --kill-child --mount-proc bash -s "$bin" "$work" "$secs" "$statefs" "$runs" "$sanity" "$go" "$rounds" <<'INNER'
set -euo pipefail
bin=$1 work=$2 secs=$3 statefs=$4 runs=$5 sanity=$6 go=$7 rounds=$8
hostpath=$bin/hostpath
[ -x "$hostpath" ] || hostpath=$bin/examples/hostpath
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; wait 2>/dev/null || true' EXIT
results=$work/results
: > "$results"

# one DRIVER ROUND: one driver's whole measurement, appended to $results as "driver figure value".
one() {
  local drv=$1 round=$2 dir=$work/$1-$2
  mkdir -p "$dir/state"
  if [ "$statefs" = tmpfs ]; then mount -t tmpfs -o size=2g tmpfs "$dir/state"; fi
  export CSI_ENDPOINT=unix://$dir/state/csi.sock
  if [ "$drv" = ours ]; then
    "$hostpath" --statedir "$dir/state" --log warn --enable-attach --nodeid n1 > "$dir/driver.log" 2>&1 &
  else
    "$go" --statedir "$dir/state/data" --endpoint "$CSI_ENDPOINT" --enable-attach --nodeid n1 --v 0 > "$dir/driver.log" 2>&1 &
  fi
  pid=$!
  for _ in $(seq 100); do [ -S "$dir/state/csi.sock" ] && break; sleep 0.05; done
  sleep 1
  rss() { awk -v k="$1" '$1 == k":" {print $2}' /proc/$pid/status; }
  echo "== $drv, round $round: idle RSS $(rss VmRSS) kB"
  local start end
  start=$(date +%s%N)
  if [ -n "$sanity" ]; then
    "$sanity" --csi.endpoint "$dir/state/csi.sock" --csi.stagingdir "$dir/stage" \
      --csi.mountdir "$dir/mnt" --csi.testvolumesize $((64 << 20)) \
      --csi.testvolumeexpandsize $((128 << 20)) --ginkgo.no-color > "$dir/sanity.txt" 2>&1 ||
      echo "csi-sanity FAILED against $drv; the benchmarks still run"
    end=$(date +%s%N)
    echo "csi-sanity: $(grep -Eo '[0-9]+ Passed \| [0-9]+ Failed \| [0-9]+ Pending \| [0-9]+ Skipped' "$dir/sanity.txt" | tail -1)"
  else
    "$bin/csi" sanity --staging-dir "$dir" --target-dir "$dir" --driver-log "$dir/driver.log" > "$dir/sanity.txt" ||
      echo "conformance run FAILED against $drv; the benchmarks still run"
    end=$(date +%s%N)
    tail -1 "$dir/sanity.txt"
  fi
  echo "conformance run: $(( (end - start) / 1000000 )) ms (wall, including connection)"
  for run in $runs; do
    local workload=${run%%:*} workers=${run##*:} rate
    rate=$("$bin/csi" -o json bench --workload "$workload" --workers "$workers" --duration "${secs}s" \
      --no-progress --work-dir "$dir/bench" | tee "$dir/bench-$run.json" |
      python3 -c "import json,sys; d=json.load(sys.stdin); print('%.1f' % d['iterations_per_second'])")
    echo "csi bench --workload $workload --workers $workers --duration ${secs}s: $rate/s"
    echo "$drv $run $rate" >> "$results"
  done
  echo "peak RSS: $(rss VmHWM) kB; after the runs: $(rss VmRSS) kB; resident by mapping (kB):"
  awk '/^[0-9a-f]+-/ {m = $6 " " $2} /^Rss:/ {r[m] += $2} END {for (m in r) if (r[m]) print r[m], m}' \
    "/proc/$pid/smaps" | sort -rn | head -8 | sed 's/^/  /'
  echo "$drv peak-rss-kB $(rss VmHWM)" >> "$results"
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
  if [ "$statefs" = tmpfs ]; then umount "$dir/state"; fi
}

for round in $(seq "$rounds"); do
  one ours "$round"
  [ -n "$go" ] && one go "$round"
done

echo "== side by side (this run; per figure: ours, Go, ours/Go over the rounds)"
python3 - "$results" <<'PY'
import sys, collections
figs = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    drv, fig, val = line.split()
    figs[fig][drv].append(float(val))
for fig, by in figs.items():
    ours, go = by.get("ours", []), by.get("go", [])
    row = "%-14s ours %s" % (fig, " ".join("%g" % v for v in ours))
    if go:
        ratios = [o / g for o, g in zip(ours, go) if g]
        row += " | go %s | ours/go %s" % (" ".join("%g" % v for v in go), " ".join("%.2fx" % r for r in ratios))
    print(row)
PY
INNER
