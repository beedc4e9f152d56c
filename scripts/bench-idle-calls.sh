#!/usr/bin/env bash
# Latency of calls to an idle driver, ours (hostpath) and the Go reference
# (csi-driver-host-path's hostpathplugin) side by side, same client, round by
# round in alternating order: Probe in a tight loop ("tight") and with a 12 ms
# pause before each call ("idle"), and the lifecycle with a 12 ms pause before
# each iteration ("paused": its CreateVolume follows the pause, the other
# calls follow each other). A CO calls a driver now and then; a call to
# a process that has been idle costs more than one in a tight loop, on this
# VM several times more (docs/benchmarks.md).
#
# Usage (root): BENCH_BIN=DIR bash scripts/bench-idle-calls.sh [rounds, default 3]
#   DIR holds `hostpath` and `csi` (default: target/x86_64-unknown-linux-gnu/dist, from
#   `bash scripts/build-dist.sh -q -p hostpath -p csi-cli --bins`); GO_DRIVER overrides
#   ../shared/tools/hostpathplugin.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "bench-idle-calls: needs root (the lifecycle mounts)" >&2; exit 1; }
rounds=${1:-3}
bin=$(realpath "${BENCH_BIN:-target/x86_64-unknown-linux-gnu/dist}")
go=$(realpath "${GO_DRIVER:-../shared/tools/hostpathplugin}")
for f in "$bin/hostpath" "$bin/csi" "$go"; do
  [ -x "$f" ] || { echo "bench-idle-calls: no $f" >&2; exit 1; }
done
work=$(mktemp -d /tmp/bench-idle.XXXXXX)
trap 'rm -rf --one-file-system "$work"' EXIT

# Mounts and processes go with the namespaces if this script is killed.
unshare -m --propagation private --pid --fork --kill-child --mount-proc \
  bash -s "$bin" "$go" "$work" "$rounds" <<'INNER'
set -euo pipefail
bin=$1 go=$2 work=$3 rounds=$4
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null || true' EXIT
mkdir -p "$work/ours" "$work/go/data"
"$bin/hostpath" --statedir "$work/ours" --log warn --enable-attach --nodeid n1 \
  > "$work/ours.log" 2>&1 &
pids+=("$!")
"$go" --statedir "$work/go/data" --endpoint "unix://$work/go/csi.sock" --enable-attach \
  --nodeid n1 --v 0 > "$work/go.log" 2>&1 &
pids+=("$!")
for s in "$work/ours/csi.sock" "$work/go/csi.sock"; do
  for _ in $(seq 100); do [ -S "$s" ] && break; sleep 0.05; done
  [ -S "$s" ] || { echo "bench-idle-calls: no socket $s" >&2; exit 1; }
done
sleep 1
echo "bench-idle-calls: $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"

# RUN DRIVER LABEL ARGS...: one `csi bench`, printed as one line per RPC.
run() {
  local drv=$1 label=$2
  shift 2
  "$bin/csi" --endpoint "unix://$work/$drv/csi.sock" -o json bench --no-progress \
    --work-dir "$work/paths-$drv" "$@" |
    python3 -c '
import json, sys
d = json.load(sys.stdin)
assert not d["errors"] and not d["leftover_volumes"], d
for rpc, r in d["rpcs"].items():
    print(sys.argv[1], sys.argv[2], rpc, "%.3f" % r["p50_ms"], "%.3f" % r["p90_ms"])
' "$drv" "$label"
}

for round in $(seq "$rounds"); do
  order="ours go"
  [ $((round % 2)) = 0 ] && order="go ours"
  for drv in $order; do
    run "$drv" tight --workload probe --count 2000
    run "$drv" idle --workload probe --count 400 --pause 12ms
    run "$drv" paused --workload lifecycle --count 100 --pause 12ms
  done
done > "$work/results"

python3 - "$work/results" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
keys = []
for drv, label, rpc, p50, p90 in rows:
    if (label, rpc) not in keys:
        keys.append((label, rpc))
def med(drv, label, rpc, col):
    v = [float(r[col]) for r in rows if r[:3] == [drv, label, rpc]]
    return statistics.median(v)
print("p50 / p90 in ms, medians over the rounds; ours/Go of the p50s")
print("%-6s %-26s %17s %17s %7s" % ("calls", "rpc", "ours p50 / p90", "Go p50 / p90", "ours/Go"))
for label, rpc in keys:
    o50, o90, g50, g90 = (med(d, label, rpc, c) for d in ("ours", "go") for c in (3, 4))
    print("%-6s %-26s %8.3f / %6.3f %8.3f / %6.3f %7.2f" % (label, rpc, o50, o90, g50, g90, o50 / g50))
PY
INNER
