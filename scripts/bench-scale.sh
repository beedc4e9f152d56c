#!/usr/bin/env bash
# Scale figures for the example drivers, each beside the Go reference driver
# (csi-driver-host-path v1.12.1) where one applies, measured in the same run
# with the same client (the `csi` CLI), alternating drivers round by round:
#   - restart: SIGKILL with N volumes staged and published, start again, and
#     time until Probe is ready and a published volume's stats answer;
#   - restart with many volumes, none staged;
#   (each restart follows a `sync`, so it does not wait on the writeback of
#   the volumes the script has just made)
#   - per-operation cost (CreateVolume+DeleteVolume, one worker) with few and
#     with many volumes already there;
#   - peak RSS per 1,000 published volumes.
# Run as root (it mounts); everything runs in a private mount and PID
# namespace and is removed at the end: a run that fails or is killed midway
# leaves no driver running (the namespace's processes die with it).
#   bash scripts/bench-scale.sh            # the issue's sizes
#   SCALE_QUICK=1 bash scripts/bench-scale.sh   # small sizes, to try it out
# BENCH_BIN=DIR uses DIR/{hostpath,loop-block} (or DIR/examples/..., as builds
# from before the drivers were packages put them) and DIR/csi instead of
# building them with scripts/build-dist.sh (the shipped build, in
# target/<host triple>/dist); GO_DRIVER=PATH names the Go driver (default
# ../shared/tools/hostpathplugin; without it only our figures are printed).
# SCALE_ROUNDS (default 2) rounds per restart figure, SCALE_MANY_ROUNDS (default 1)
# for the many-volume figures (each makes SCALE_MANY volumes), SCALE_COST_SECS (default 5)
# per create+delete rate; SCALE_GO_MANY=1 adds the Go driver to the many-volume figures
# (SCALE_MANY more of its CreateVolume calls); SCALE_PUBLISHED, SCALE_LOOP,
# SCALE_MANY, SCALE_FEW override the sizes; SCALE_ONLY=hostpath or loop-block measures that one.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "bench-scale: needs root (it mounts and attaches loop devices)"; exit 1; }

if [ -n "${SCALE_QUICK:-}" ]; then
  published=${SCALE_PUBLISHED:-"0 10 50"} loopn=${SCALE_LOOP:-"0 5 10"}
  many=${SCALE_MANY:-500} few=${SCALE_FEW:-10}
else
  published=${SCALE_PUBLISHED:-"0 100 1000"} loopn=${SCALE_LOOP:-"0 50 200"}
  many=${SCALE_MANY:-10000} few=${SCALE_FEW:-10}
fi
rounds=${SCALE_ROUNDS:-2}
only=${SCALE_ONLY:-}
[ "$only" = loop-block ] && published=
[ "$only" = hostpath ] && loopn=
many_rounds=${SCALE_MANY_ROUNDS:-1} cost_secs=${SCALE_COST_SECS:-5} go_many=${SCALE_GO_MANY:-}
if [ -n "${BENCH_BIN:-}" ]; then
  bin=$(cd "$BENCH_BIN" && pwd)
else
  bin=$(bash scripts/build-dist.sh -q -p hostpath -p loop-block -p csi-cli --bins)
fi
go=${GO_DRIVER:-$PWD/../shared/tools/hostpathplugin}
[ -x "$go" ] || { echo "bench-scale: no Go driver at $go; printing our figures alone"; go=; }
work=$(mktemp -d /tmp/csi-scale.XXXXXX)
trap 'rm -rf "$work"' EXIT

unshare -m --propagation private --pid --fork --kill-child --mount-proc bash -s "$bin" "$go" "$work" "$rounds" "$published" "$loopn" "$many" "$few" \
  "$many_rounds" "$cost_secs" "$go_many" "$only" <<'INNER'
set -euo pipefail
bin=$1 go=$2 work=$3 rounds=$4 published=$5 loopn=$6 many=$7 few=$8
many_rounds=$9 cost_secs=${10} go_many=${11} only=${12}
drivers=$bin
[ -x "$drivers/hostpath" ] || drivers=$bin/examples
csi=$bin/csi
loop=loop; [ -x "$drivers/loop-block" ] || { echo "bench-scale: no loop-block in $drivers; hostpath alone"; loop=; loopn=; }
pid=
# cleanup [DIR]: stops the driver and removes what it left mounted or attached
# under DIR (default: everything this script made).
cleanup() {
  local under=${1:-$work}/
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; wait 2>/dev/null || true
  awk -v w="$under" 'index($5, w) == 1 {print $5}' /proc/self/mountinfo | sort -r | xargs -r umount -l 2>/dev/null || true
  losetup -a 2>/dev/null | awk -F: -v w="$under" 'index($0, w) {print $1}' | xargs -r -n1 losetup -d 2>/dev/null || true
}
trap cleanup EXIT

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
hwm() { awk '$1 == "VmHWM:" {print $2}' "/proc/$pid/status"; }

# start DRIVER DIR: runs the driver with its state in DIR.
start() {
  local drv=$1 dir=$2
  mkdir -p "$dir"
  export CSI_ENDPOINT=unix://$dir/csi.sock
  case $drv in
    ours) "$drivers/hostpath" --statedir "$dir/state" --endpoint "$CSI_ENDPOINT" --nodeid n1 --log warn >> "$dir/driver.log" 2>&1 & ;;
    go) "$go" --statedir "$dir/state" --endpoint "$CSI_ENDPOINT" --nodeid n1 --v 0 >> "$dir/driver.log" 2>&1 & ;;
    loop) "$drivers/loop-block" --statedir "$dir/state" --endpoint "$CSI_ENDPOINT" --nodeid n1 --log warn >> "$dir/driver.log" 2>&1 & ;;
  esac
  pid=$!
}

# ready VOL TARGET: polls until Probe says ready and, with a volume, its stats answer.
ready() {
  local deadline=$(( $(now_ms) + 120000 )) probe
  while [ "$(now_ms)" -lt "$deadline" ]; do
    # An absent `ready` means ready (CSI spec, Probe).
    if probe=$("$csi" -o json identity probe 2>/dev/null) && ! grep -q '"ready": false' <<<"$probe" &&
       { [ -z "$1" ] || "$csi" node stats "$1" --volume-path "$2" >/dev/null 2>&1; }; then
      return 0
    fi
    sleep 0.002
  done
  echo "driver never got ready; log:" >&2; tail -5 "$dir/driver.log" >&2; return 1
}

# populate DRIVER DIR FROM TO STAGE: creates volumes FROM..TO, staged and published when STAGE=1.
# One `csi` process per call, eight at a time, and no other interpreter: the 10,000-volume runs
# are bound by how fast the volumes can be made.
populate() {
  local drv=$1 dir=$2 from=$3 to=$4 stage=$5
  [ "$from" -le "$to" ] || return 0
  export drv dir stage csi
  seq "$from" "$to" | xargs -P 8 -I{} bash -c '
    set -e
    block=(); [ "$drv" = loop ] && block=(--block)
    id=$("$csi" -o json controller create-volume "scale-{}" --size 1Mi "${block[@]}" |
      sed -n "s/.*\"volume_id\": *\"\([^\"]*\)\".*/\1/p" | head -1)
    [ -n "$id" ] || { echo "CreateVolume scale-{} gave no volume id" >&2; exit 1; }
    echo "$id" > "$dir/ids/{}"
    [ "$stage" = 1 ] || exit 0
    ctx=()
    if [ "$drv" = loop ]; then
      while read -r kv; do ctx+=(--publish-context "$kv"); done < <("$csi" -o json controller publish-volume "$id" --node n1 --block |
        tr -d "\n" | grep -o "\"publish_context\": *{[^}]*}" | grep -o "\"[^\"]*\": *\"[^\"]*\"" |
        sed "s/\"\([^\"]*\)\": *\"\([^\"]*\)\"/\1=\2/")
    fi
    mkdir -p "$dir/stage/{}"
    "$csi" node stage "$id" --staging-path "$dir/stage/{}" "${block[@]}" "${ctx[@]}" >/dev/null
    "$csi" node publish "$id" --staging-path "$dir/stage/{}" --target-path "$dir/mnt/{}" "${block[@]}" "${ctx[@]}" >/dev/null'
}

# rate: CreateVolume+DeleteVolume per second, one worker, against the running driver.
rate() {
  "$csi" -o json bench --workload create-delete --workers 1 --duration "${cost_secs}s" --no-progress --work-dir "$dir/bench" |
    sed -n 's/.*"iterations_per_second": *\([0-9.]*\).*/\1/p' | head -1
}

# restart DRIVER N STAGE [cost]: prints "ms hwm_kb idle_hwm_kb [rate]" for a restart with N
# volumes; with `cost`, then the CreateVolume+DeleteVolume rate with those N present.
restart() {
  local drv=$1 n=$2 stage=$3 cost=${4:-}
  dir=$work/$drv-$n-$RANDOM
  mkdir -p "$dir/ids" "$dir/mnt"
  start "$drv" "$dir"; ready "" ""
  local idle; idle=$(hwm)
  populate "$drv" "$dir" 1 "$n" "$stage"
  local peak; peak=$(hwm)
  # Write back the volumes just made before the kill, for both drivers
  # alike: otherwise the restart measures the writeback of this script's
  # own creations (a busy node's restart is not preceded by thousands of
  # them in the last second).
  sync
  kill -9 "$pid"; wait "$pid" 2>/dev/null || true
  local vol="" path=""
  if [ "$n" -gt 0 ] && [ "$stage" = 1 ]; then vol=$(cat "$dir/ids/$n"); path=$dir/mnt/$n; fi
  local t0; t0=$(now_ms)
  start "$drv" "$dir"; ready "$vol" "$path"
  local t1; t1=$(now_ms)
  local r=""; [ -z "$cost" ] || r=$(rate)
  kill -9 "$pid"; wait "$pid" 2>/dev/null || true; pid=
  cleanup "$dir"
  rm -rf "$dir"
  # Last, and read through $(...), which waits for this function to end:
  # the caller's next restart must not overlap this one's cleanup.
  echo "$((t1 - t0)) $peak $idle $r"
}

# opcost DRIVER N: CreateVolume+DeleteVolume per second (one worker) with N volumes present.
opcost() {
  local drv=$1 n=$2
  dir=$work/$drv-cost-$n
  mkdir -p "$dir/ids"
  start "$drv" "$dir"; ready "" ""
  populate "$drv" "$dir" 1 "$n" 0
  local r; r=$(rate)
  kill -9 "$pid"; wait "$pid" 2>/dev/null || true; pid=
  cleanup "$dir"
  rm -rf "$dir"
  echo "$r"
}

drivers() { if [ -n "$go" ]; then echo "$1 go"; else echo "$1"; fi; }
ratio() { python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print('%.2fx' % (a/b) if b else '-')" "$1" "$2"; }

echo "== restart with N volumes staged and published (ms until Probe ready and a published volume's stats answer)"
for n in $published; do
  for r in $(seq "$rounds"); do
    line="hostpath N=$n round $r:"
    for d in $(drivers ours); do
      read -r ms peak idle <<<"$(restart "$d" "$n" 1)"
      line="$line $d ${ms} ms (peak RSS ${peak} kB, +$(( (peak - idle) * 1000 / (n > 0 ? n : 1) )) kB per 1000 volumes);"
      eval "last_$d=$ms"
    done
    [ -n "$go" ] && line="$line ours/go $(ratio "$last_ours" "$last_go")"
    echo "$line"
  done
done
for n in $loopn; do
  for r in $(seq "$rounds"); do
    read -r ms peak idle <<<"$(restart loop "$n" 1)"
    echo "loop-block N=$n round $r: ${ms} ms (peak RSS ${peak} kB, +$(( (peak - idle) * 1000 / (n > 0 ? n : 1) )) kB per 1000 volumes)"
  done
done

echo "== restart with $many volumes, none staged (ms until Probe ready); then CreateVolume+DeleteVolume per second (one worker, ${cost_secs} s) with them present vs with $few"
many_drivers="ours $loop"; [ -n "$go" ] && [ -n "$go_many" ] && many_drivers="ours go $loop"
[ "$only" = loop-block ] && many_drivers=$loop
[ "$only" = hostpath ] && many_drivers=${many_drivers% "$loop"}
for r in $(seq "$many_rounds"); do
  for d in $many_drivers; do
    read -r ms peak idle b <<<"$(restart "$d" "$many" 0 cost)"
    a=$(opcost "$d" "$few")
    echo "$d round $r: restart ${ms} ms (peak RSS ${peak} kB); $a/s with $few, $b/s with $many: cost ratio $(ratio "$a" "$b")"
  done
done
INNER
