#!/bin/bash
# Side-by-side comparison of spool with beanstalkd, Redis Streams, an SQLite queue table and
# POSIX message queues on the same workloads (issue 7; docs/performance.md).
#
# Usage: bench/compare/run.sh [--quick] [--json] [--build DIR] [--systems LIST] [--out FILE]
#   --quick         20,000 messages, 100 B only, fewer sync=always messages (< 5 min)
#   --json          one JSON object per run on stdout (and one per target at the end)
#                   instead of the tables
#   --build DIR     meson build directory to use (default: build-compare at the repo root;
#                   set up with --buildtype=release if missing)
#   --systems LIST  comma-separated subset of spool,beanstalkd,redis-streams,sqlite-queue,posix-mq,
#                   spool-uring (spool with SPOOL_IO=io_uring: its io_uring backend, not the default mmap)
#   --out FILE      also keep the JSON lines in FILE
#   --n N / --n-large N / --n-always N   message counts (defaults below)
#
# Installs what it needs with apt-get (root, or sudo), builds the drivers, starts its own
# beanstalkd and redis-server on 127.0.0.1 at free ports with their data in a temp dir under
# /var/tmp (a disk: on tmpfs fsync is free), and stops them by PID when done or interrupted.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$ROOT/bench/compare"

quick=0; json=0; build="$ROOT/build-compare"; out=""
systems="spool,beanstalkd,redis-streams,sqlite-queue,posix-mq,spool-uring"
n=""; n_large=""; n_always=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --json) json=1 ;;
    --build) build=$2; shift ;;
    --build=*) build=${1#*=} ;;
    --systems) systems=$2; shift ;;
    --systems=*) systems=${1#*=} ;;
    --out) out=$2; shift ;;
    --out=*) out=${1#*=} ;;
    --n=*) n=${1#*=} ;;
    --n-large=*) n_large=${1#*=} ;;
    --n-always=*) n_always=${1#*=} ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "compare: unknown argument $1" >&2; exit 64 ;;
  esac
  shift
done

if [ $quick = 1 ]; then
  n=${n:-20000}; n_always=${n_always:-300}; sizes="100"; lat_always=300
else
  # 4 KiB runs use fewer messages (and skip sync=always) to keep the full run near 30 min
  # on 2 cores.
  n=${n:-200000}; n_large=${n_large:-50000}; n_always=${n_always:-2000}; sizes="100 4096"; lat_always=2000
fi
lat_samples=2000

log() { echo "compare: $*" >&2; }
has() { case ",$systems," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# ---- dependencies -------------------------------------------------------------------------
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
bash "$ROOT/scripts/deps.sh"
need=()
for p in beanstalkd redis-server libhiredis-dev libsqlite3-dev python3; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # The packages' postinst may have started the system services: this script runs its own
  # instances on other ports, so stop those (and keep them from starting at boot).
  for svc in beanstalkd redis-server; do
    if [ -d /run/systemd/system ]; then
      $SUDO systemctl disable --now "$svc" >/dev/null 2>&1 || true
    elif command -v service >/dev/null; then
      $SUDO service "$svc" stop >/dev/null 2>&1 || true
    fi
  done
fi

# ---- build --------------------------------------------------------------------------------
if [ ! -f "$build/build.ninja" ]; then
  log "meson setup $build"
  meson setup "$build" "$ROOT" --buildtype=release -Dtests=false -Dfuzz=false >/dev/null ||
    { log "meson setup failed"; exit 1; }
fi
bin="$build/bench/compare"
targets=()
for t in spool beanstalkd redis sqlite posixmq fdatasync; do
  targets+=("bench/compare/cmp_$t")
done
if ! ninja -C "$build" -t query "bench/compare/cmp_redis" >/dev/null 2>&1 ||
   ! ninja -C "$build" -t query "bench/compare/cmp_sqlite" >/dev/null 2>&1; then
  meson setup --reconfigure "$build" "$ROOT" >/dev/null  # the client libraries were just installed
fi
avail=()
for t in "${targets[@]}"; do
  ninja -C "$build" -t query "$t" >/dev/null 2>&1 && avail+=("$t")
done
log "building ${avail[*]}"
if ! build_log=$(ninja -C "$build" "${avail[@]}" 2>&1); then
  echo "$build_log" | tail -n 40 >&2; log "build failed"; exit 1
fi

# ---- the run's scratch space and servers ----------------------------------------------------
work=$(mktemp -d /var/tmp/spool-compare.XXXXXX)
results="$work/results.jsonl"
: >"$results"
server_pid=""
mq_old=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  if [ -n "$mq_old" ]; then echo "$mq_old" >/proc/sys/fs/mqueue/msg_max 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fstype=$(stat -f -c %T "$work")
[ "$fstype" = tmpfs ] && log "warning: $work is on tmpfs: fsync costs nothing there"

# POSIX mq: allow deeper queues than the default 10 (restored at exit).
if has posix-mq && [ -w /proc/sys/fs/mqueue/msg_max ]; then
  mq_old=$(cat /proc/sys/fs/mqueue/msg_max)
  [ "$mq_old" -lt 10000 ] && echo 10000 >/proc/sys/fs/mqueue/msg_max
fi

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}
wait_port() {  # wait_port PORT PID
  for _ in $(seq 1 200); do
    kill -0 "$2" 2>/dev/null || { log "server exited at start"; return 1; }
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  log "server did not listen on $1"; return 1
}
stop_server() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}
# start_server SYSTEM SYNC: a fresh instance (new data directory) on a free port.
start_server() {
  local sys=$1 sync=$2 data="$work/$1-data"
  rm -rf "$data"; mkdir -p "$data"
  port=$(free_port)
  case "$sys" in
    beanstalkd)
      local args=(-l 127.0.0.1 -p "$port")
      case "$sync" in
        always) args+=(-b "$data" -f 0) ;;  # fsync after every write
        interval) args+=(-b "$data") ;;     # binlog, fsync at most every 50 ms (the default -f)
        never) ;;                           # no binlog
      esac
      beanstalkd "${args[@]}" >"$work/beanstalkd.log" 2>&1 &
      ;;
    redis-streams)
      local args=(--bind 127.0.0.1 --port "$port" --dir "$data" --save "" --daemonize no
                  --protected-mode yes --logfile "$work/redis.log")
      case "$sync" in
        always) args+=(--appendonly yes --appendfsync always) ;;
        interval) args+=(--appendonly yes --appendfsync everysec) ;;
        never) args+=(--appendonly no) ;;
      esac
      redis-server "${args[@]}" &
      ;;
  esac
  server_pid=$!
  wait_port "$port" "$server_pid"
}

driver() {
  case "$1" in
    spool|spool-uring) echo "$bin/cmp_spool" ;; beanstalkd) echo "$bin/cmp_beanstalkd" ;;
    redis-streams) echo "$bin/cmp_redis" ;; sqlite-queue) echo "$bin/cmp_sqlite" ;;
    posix-mq) echo "$bin/cmp_posixmq" ;;
  esac
}

serial=0
# run SYSTEM SYNC CASE SIZE N [driver args...]: one run, its JSON line appended to results.
run() {
  local sys=$1 sync=$2 kase=$3 size=$4 count=$5; shift 5
  local exe; exe=$(driver "$sys")
  has "$sys" || return 0
  if [ ! -x "$exe" ]; then log "skipping $sys: driver not built"; return 0; fi
  serial=$((serial + 1))
  local tag="cmp$serial-$$" port=0 line rc=0
  case "$sys" in beanstalkd|redis-streams) start_server "$sys" "$sync" || return 0 ;; esac
  local io=mmap; [ "$sys" = spool-uring ] && io=io_uring
  line=$(SPOOL_IO=$io timeout 900 "$exe" --case="$kase" --sync="$sync" --size="$size" --n="$count" \
           --samples="$lat_samples" --dir="$work" --port="${port:-0}" --tag="$tag" "$@") || rc=$?
  stop_server
  if [ -z "$line" ]; then
    line="{\"system\": \"$sys\", \"case\": \"$kase\", \"sync\": \"$sync\", \"size\": $size, \"msgs_per_s\": null, \"p50_us\": null, \"p99_us\": null, \"n\": $count, \"seconds\": null, \"check\": \"FAILED (exit $rc)\"}"
  fi
  echo "$line" >>"$results"
  if [ $json = 1 ]; then echo "$line"; else python3 "$HERE/report.py" --progress "$line" >&2; fi
}

# ---- the plan -------------------------------------------------------------------------------
start=$(date +%s)
log "$(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); data in $work ($fstype)"
peers_sync=(spool beanstalkd redis-streams sqlite-queue)
for size in $sizes; do
  count=$n; [ "$size" -gt 100 ] && count=$n_large
  for sync in interval never always; do
    # 4 KiB at sync=always says nothing the 100 B row does not (the fdatasync dominates): skipped.
    if [ "$size" -gt 100 ] && [ $sync = always ]; then continue; fi
    c=$count; [ $sync = always ] && c=$n_always
    for sys in "${peers_sync[@]}"; do
      for kase in produce produce_batch e2e_1c e2e_2c; do run "$sys" "$sync" "$kase" "$size" "$c"; done
      if [ "$size" = 100 ]; then
        if [ $sync = always ]; then run "$sys" "$sync" latency "$size" "$c" --samples=$lat_always
        else run "$sys" "$sync" latency "$size" "$c"; fi
      fi
    done
  done
  for kase in produce e2e_1c e2e_2c; do run posix-mq none "$kase" "$size" "$count"; done
  [ "$size" = 100 ] && run posix-mq none latency "$size" "$count"
done
# spool with its io_uring I/O backend (SPOOL_IO=io_uring) instead of the default mmap, for comparison.
for sync in interval always; do
  c=$n; [ $sync = always ] && c=$n_always
  for kase in produce e2e_1c e2e_2c; do run spool-uring "$sync" "$kase" 100 "$c"; done
  if [ $sync = always ]; then run spool-uring "$sync" latency 100 "$c" --samples=$lat_always
  else run spool-uring "$sync" latency 100 "$c"; fi
done
run spool-uring always produce_mp 100 $((n_always * 4)) --producers=8
# Group commit: sync=always with 8 producer processes vs 1 (the produce row above), and the
# one-fdatasync-per-message loop.
run spool always produce_mp 100 $((n_always * 4)) --producers=8
if [ $quick = 0 ]; then
  for sys in beanstalkd redis-streams sqlite-queue; do run "$sys" always produce_mp 100 $((n_always * 2)) --producers=8; done
fi
if has spool; then
  # The baseline of the target (append + fdatasync), and for context the same in place in a
  # preallocated file through io_uring, as spool writes and syncs its segments.
  for variant in "" "--prealloc --uring"; do
    # shellcheck disable=SC2086
    line=$("$bin/cmp_fdatasync" --n="$n_always" --size=100 --dir="$work" $variant) || continue
    echo "$line" >>"$results"
    if [ $json = 1 ]; then echo "$line"; else python3 "$HERE/report.py" --progress "$line" >&2; fi
  done
fi
elapsed=$(( $(date +%s) - start ))
log "done in ${elapsed}s; load $(cut -d' ' -f1-3 /proc/loadavg)"
[ -n "$out" ] && cp "$results" "$out"
if [ $json = 1 ]; then
  python3 "$HERE/report.py" --targets-json "$results"
else
  python3 "$HERE/report.py" "$results"
fi
