#!/usr/bin/env bash
# Runs the community's csi-sanity (kubernetes-csi/csi-test) against the
# example drivers the way vendors' CIs run it: size flags, and for some runs
# a secrets file (--csi.secrets; the drivers' debug logs are then searched
# for the secrets) and mutable parameters (--csi.testvolumemutableparameters;
# see "Runs with a secrets file" below). hostpath in mount and block mode (attach on, an attach limit,
# the state dir on its own loop-backed filesystem so group snapshots are
# offered, snapshots on another filesystem), loop-block in mount and block
# mode; loop-block split (`loop-block-split:mount|block`: controller and
# node as two processes, csi-sanity on --csi.controllerendpoint and
# --csi.endpoint); cloud-block split (a cloud-provider process, the driver's
# controller and node as two more processes: --csi.controllerendpoint and
# --csi.endpoint) in mount and block mode, and again with the provider
# injecting 20% transient errors and 100 ms latency (cloud-block-faults).
# loop-block's mount run takes the path of kernels before 6.8
# (CSI_KIT_STATMOUNT=off: the mount table read instead of statmount(2)).
# Everything happens in a private mount namespace and is cleaned up
# (mounts, loop devices, sockets, processes) even on failure.
#
# Prints `csi-sanity <driver> <mode>: N passed, N failed, N skipped` per run
# and exits non-zero if any run has a failure. Skips (exit 0, saying why)
# when the binary is absent or we are not root.
#
# Environment: CSI_SANITY (the binary, default ../shared/tools/csi-sanity),
# CSI_SANITY_RUNS (which runs, default "hostpath:mount hostpath:block
# loop-block:mount loop-block:block loop-block-split:mount loop-block-split:block
# cloud-block:mount cloud-block:block
# cloud-block-faults:mount cloud-block-faults:block"), CSI_SANITY_ARGS (extra csi-sanity
# flags, e.g. --ginkgo.focus=REGEX for one spec by hand).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

sanity=${CSI_SANITY:-$root/../shared/tools/csi-sanity}
if [ ! -x "$sanity" ]; then
  echo "csi-sanity: skipped: no binary at $sanity"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "csi-sanity: skipped: needs root (the drivers mount and attach loop devices)"
  exit 0
fi
for tool in unshare losetup mkfs.ext4 mount umount; do
  if ! command -v "$tool" >/dev/null; then
    echo "csi-sanity: skipped: $tool is not installed"
    exit 0
  fi
done

# The drivers as they are now (a no-op after scripts/test.sh built them).
default_runs="hostpath:mount hostpath:block loop-block:mount loop-block:block loop-block-split:mount loop-block-split:block cloud-block:mount cloud-block:block cloud-block-faults:mount cloud-block-faults:block"
runs=${CSI_SANITY_RUNS:-$default_runs}
if [ -z "${CSI_SANITY_IN_NS:-}" ]; then
  case " $runs" in *" hostpath:"*|*" loop-block"*)
    cargo build --quiet -p hostpath -p loop-block --bins ;;
  esac
  case " $runs" in *" cloud-block"*) cargo build --quiet -p cloud-block --bins ;; esac
fi

# Everything below runs in a private mount namespace (no mount can leak to
# the host; its mounts vanish with its last process) and its own PID
# namespace (if this script is killed outright, the kernel kills the
# drivers too, so nothing keeps the namespace alive).
if [ -z "${CSI_SANITY_IN_NS:-}" ]; then
  exec env CSI_SANITY_IN_NS=1 unshare --mount --propagation private --pid --fork --kill-child \
    --mount-proc bash "$0" "$@"
fi

# Small volumes keep the block runs fast; sizes are the only flags we pass.
size=$((64 << 20))
expand=$((128 << 20))
attach_limit=16

work=$(mktemp -d /tmp/csi-sanity.XXXXXX)
logs=$root/target/csi-sanity
mkdir -p "$logs"

# What vendors also pass (--csi.secrets, --csi.testvolumemutableparameters),
# for the runs that say so below. Every request kind csi-sanity sends secrets
# with gets a value unique to this run; the driver's debug log must never
# show one.
marker=sanity-secret-$$-$RANDOM
secrets_file=$work/secrets.yaml
for kind in CreateVolume DeleteVolume ControllerPublishVolume ControllerUnpublishVolume \
    ControllerValidateVolumeCapabilities NodeStageVolume NodePublishVolume CreateSnapshot \
    DeleteSnapshot ControllerExpandVolume ListSnapshots NodeExpandVolume ControllerModifyVolume; do
  printf '%sSecret:\n  password: "%s-%s"\n' "$kind" "$marker" "$kind"
done >"$secrets_file"
driver_pid=
# cloud-block's other processes (its controller, then the provider).
other_pids=()

stop_pid() {
  local pid=$1
  kill "$pid" 2>/dev/null || true
  # A process that ignores SIGTERM for 10 s is killed.
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

stop_driver() {
  local pid
  if [ -n "$driver_pid" ]; then
    stop_pid "$driver_pid"
    driver_pid=
  fi
  for pid in "${other_pids[@]}"; do stop_pid "$pid"; done
  other_pids=()
}

# Unmounts everything under $1 (deepest first) and detaches every loop
# device whose backing file is under it.
release() {
  local dir=$1 m dev
  for _ in 1 2 3; do
    awk -v d="$dir" '$5 == d || index($5, d "/") == 1 {print $5}' /proc/self/mountinfo |
      sort -r | while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
  done
  losetup -a -O NAME,BACK-FILE --noheadings 2>/dev/null |
    awk -v d="$dir" 'index($2, d "/") == 1 {print $1}' |
    while read -r dev; do losetup -d "$dev" 2>/dev/null || true; done
}

# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
  stop_driver
  release "$work"
  # Never into a filesystem that failed to unmount.
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
# csi-sanity stops cleanly on SIGINT/SIGTERM itself; bash acts on a signal
# only once the foreground child has exited (and drops a SIGINT the child
# handled), so a run also counts as interrupted when ginkgo says so.
interrupted=
trap 'interrupted=1' INT TERM

# Waits for a socket, or fails if its process ($2, default the driver) died.
wait_socket() {
  local sock=$1 pid=${2:-$driver_pid}
  for _ in $(seq 300); do
    [ -S "$sock" ] && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# cloud-block split: starts a cloud-provider (faults as $1 says), the
# driver's controller (into other_pids) and its node (driver_pid) in $dir;
# sets sanity_args' endpoints.
start_cloud_block() {
  local faults=$1 url line cb=target/debug/cloud-block
  mkdir -p "$dir/cloud" "$dir/by-id" "$dir/node"
  export CLOUD_PROVIDER_TOKEN=sanity-token
  local fault_args=()
  [ "$faults" = faults ] && fault_args=(--fault-error-rate 0.2 --fault-latency-ms 100)
  coproc provider { target/debug/cloud-provider --listen 127.0.0.1:0 --data-dir "$dir/cloud" \
    --device-dir "$dir/by-id" --node sanity-node --max-volumes-per-node 64 "${fault_args[@]}" \
    --log warn 2>"$logs/$driver-$mode.provider.log"; }
  other_pids+=("$provider_PID")
  read -r -t 30 line <&"${provider[0]}" || return 1
  url=${line#listening on }
  "$cb" --mode controller --endpoint "unix://$dir/controller.sock" --provider-url "$url" \
    --log "$log_level" >"$logs/$driver-$mode.controller.log" 2>&1 &
  other_pids=("$!" "${other_pids[@]}")
  wait_socket "$dir/controller.sock" "$!" || return 1
  env -u CLOUD_PROVIDER_TOKEN "$cb" --mode node --endpoint "unix://$sock" --nodeid sanity-node \
    --device-dir "$dir/by-id" --statedir "$dir/node" --max-volumes-per-node 64 --log "$log_level" \
    >"$logs/$driver-$mode.driver.log" 2>&1 &
  driver_pid=$!
  sanity_args+=(--csi.controllerendpoint "$dir/controller.sock")
}

# loop-block split: starts its controller (--mode controller, its own
# state dir, the disks in the data dir it shares with the node; into
# other_pids) and waits for its socket; the node is then started as the
# run's driver. Both get the same node id: the controller attaches to its
# one node.
start_loop_block_split() {
  local log=$1 pid
  mkdir -p "$dir/controller" "$dir/node" "$dir/data"
  target/debug/loop-block --mode controller --endpoint "unix://$dir/controller.sock" \
    --statedir "$dir/controller" --datadir "$dir/data" --nodeid sanity-node \
    --attach-limit "$attach_limit" --log "$log_level" >"$log" 2>&1 &
  pid=$!
  other_pids+=("$pid")
  wait_socket "$dir/controller.sock" "$pid"
}

# A dedicated ext4 filesystem on a loop device (autoclear: it detaches when
# unmounted, or when the namespace goes away).
make_fs() {
  local img=$1 dir=$2
  truncate -s 1G "$img" && mkfs.ext4 -q -F "$img" && mkdir -p "$dir" &&
    mount -o loop "$img" "$dir"
}

status=0
for run in $runs; do
  [ -n "$interrupted" ] && break
  driver=${run%%:*}
  mode=${run#*:}
  dir=$work/$driver-$mode
  mkdir -p "$dir"
  sock=$dir/csi.sock
  args=()
  # Runs with a secrets file (and a debug log that must not show them), and
  # mutable parameters where the driver accepts some: hostpath as its Go
  # counterpart is run (an accepted name), loop-block with its own tuning.
  # The mount runs of hostpath and loop-block stay bare.
  vendor= log_level=warn driver_env=()
  case "$run" in hostpath:block|loop-block:block|loop-block-split:*|cloud-block:*) vendor=1 log_level=debug ;; esac
  bin=$driver
  [ "$run" = loop-block:mount ] && driver_env=(CSI_KIT_STATMOUNT=off)
  case "$driver" in
    hostpath)
      if ! make_fs "$dir/state.img" "$dir/state"; then
        echo "csi-sanity $driver $mode: could not make its state filesystem"
        status=1
        release "$dir"
        continue
      fi
      mkdir -p "$dir/snapshots"
      args=(--statedir "$dir/state" --snapshotdir "$dir/snapshots" --enable-attach
            --nodeid sanity-node)
      ;;
    loop-block)
      mkdir -p "$dir/state"
      args=(--statedir "$dir/state" --nodeid sanity-node)
      ;;
    loop-block-split)
      bin=loop-block
      if ! start_loop_block_split "$logs/$driver-$mode.controller.log"; then
        echo "csi-sanity $driver $mode: the controller did not start (see $logs/$driver-$mode.controller.log)"
        status=1
        stop_driver
        release "$dir"
        continue
      fi
      args=(--mode node --statedir "$dir/node" --datadir "$dir/data" --nodeid sanity-node)
      ;;
    cloud-block|cloud-block-faults) ;;
    *) echo "csi-sanity: unknown driver $driver"; exit 2 ;;
  esac
  # A driver with an attach limit flag gets one, and the attach-limit spec.
  if [ -x "target/debug/$bin" ] &&
     "target/debug/$bin" --help | grep -q -- '--attach-limit'; then
    args+=(--attach-limit "$attach_limit")
  fi
  mutable=
  if [ -n "$vendor" ]; then
    case "$driver" in
      hostpath) args+=(--accepted-mutable-parameter-name=iops); mutable='iops: "3000"' ;;
      loop-block|loop-block-split) mutable='readAheadKiB: "256"' ;;
    esac
  fi
  run_size=$size run_expand=$expand
  # The provider's sizes are whole GiB.
  case "$driver" in cloud-block*) run_size=$((1 << 30)) run_expand=$((2 << 30)) ;; esac
  sanity_args=(--csi.endpoint "$sock" --csi.stagingdir "$dir/stage" --csi.mountdir "$dir/mnt"
               --csi.testvolumesize "$run_size" --csi.testvolumeexpandsize "$run_expand"
               --csi.testnodevolumeattachlimit --ginkgo.no-color --ginkgo.v)
  [ "$mode" = block ] && sanity_args+=(--csi.testvolumeaccesstype block)
  [ "$driver" = loop-block-split ] && sanity_args+=(--csi.controllerendpoint "$dir/controller.sock")
  if [ -n "$vendor" ]; then
    sanity_args+=(--csi.secrets "$secrets_file")
    if [ -n "$mutable" ]; then
      printf '%s\n' "$mutable" >"$dir/mutable.yaml"
      sanity_args+=(--csi.testvolumemutableparameters "$dir/mutable.yaml")
    fi
  fi
  # shellcheck disable=SC2206 # word splitting is wanted for extra flags
  [ -n "${CSI_SANITY_ARGS:-}" ] && sanity_args+=(${CSI_SANITY_ARGS})

  log=$logs/$driver-$mode.log
  started=1
  case "$driver" in
    cloud-block) start_cloud_block none || started= ;;
    cloud-block-faults) start_cloud_block faults || started= ;;
    *)
      env "${driver_env[@]}" "target/debug/$bin" --endpoint "unix://$sock" "${args[@]}" --log "$log_level" \
        >"$logs/$driver-$mode.driver.log" 2>&1 &
      driver_pid=$!
      ;;
  esac
  if [ -z "$started" ] || ! wait_socket "$sock"; then
    echo "csi-sanity $driver $mode: the driver did not start (see $logs/$driver-$mode.driver.log)"
    status=1
    stop_driver
    release "$dir"
    continue
  fi
  set +e
  timeout --foreground 900 "$sanity" "${sanity_args[@]}" >"$log" 2>&1
  rc=$?
  set -e
  stop_driver
  release "$dir"
  grep -q 'Interrupted by User' "$log" && interrupted=1
  if [ -n "$interrupted" ]; then
    echo "csi-sanity $driver $mode: interrupted"
    status=130
    break
  fi

  # ginkgo's summary: "N Passed | N Failed | N Pending | N Skipped".
  line=$(grep -E '[0-9]+ Passed \| [0-9]+ Failed' "$log" | tail -1 || true)
  if [ -z "$line" ]; then
    echo "csi-sanity $driver $mode: no summary (exit $rc; see $log)"
    tail -20 "$log"
    status=1
    continue
  fi
  passed=$(sed -E 's/.* ([0-9]+) Passed.*/\1/' <<<" $line")
  failed=$(sed -E 's/.* ([0-9]+) Failed.*/\1/' <<<"$line")
  skipped=$(sed -E 's/.* ([0-9]+) Skipped.*/\1/' <<<"$line")
  result="csi-sanity $driver $mode: $passed passed, $failed failed, $skipped skipped"
  [ ${#driver_env[@]} -gt 0 ] && result+=" (${driver_env[*]})"
  if [ -n "$vendor" ]; then
    result+=" (secrets file${mutable:+, mutable parameters})"
    # The driver's processes logged every call at debug level: no secret.
    leaked=$(grep -l -- "$marker" "$logs/$driver-$mode".*.log 2>/dev/null || true)
    logged=$(cat "$logs/$driver-$mode".*.log 2>/dev/null | wc -l)
    if [ -n "$leaked" ] || [ "$logged" -lt 100 ]; then
      echo "csi-sanity $driver $mode: a secret is in $leaked (or the debug log is missing: $logged lines)"
      status=1
    fi
  fi
  echo "$result"
  if [ "$failed" != 0 ] || [ "$rc" != 0 ]; then
    status=1
    grep -E '^\s*\[FAIL\]' "$log" | sed 's/^/  /' | sort -u || true
  fi
  # Why specs were skipped, one line per reason (ginkgo -v prints
  # "S [SKIPPED]", the spec, then "  [SKIPPED] <reason>").
  awk '/^S \[SKIPPED\]/ {want = 1; next}
       want && /^  \[SKIPPED\] / {sub(/^  \[SKIPPED\] /, ""); n[$0]++; want = 0}
       END {for (r in n) printf "    skipped %d: %s\n", n[r], r}' "$log" | sort
done
exit "$status"
