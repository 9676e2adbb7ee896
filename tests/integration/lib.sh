#!/usr/bin/env bash
# Shared helpers for the integration tests: real tandem-coordinator,
# tandem-worker and tandemctl processes on 127.0.0.1 with ephemeral ports.
# Every process started here is in its own process group and is stopped by
# the EXIT trap; every wait is bounded. Binaries come from the environment
# (set by tests/integration/CMakeLists.txt): TANDEMCTL,
# TANDEM_COORDINATOR_BIN, TANDEM_WORKER_BIN; optional TANDEM_PY_GEN for the
# gRPC health check. What the helpers call (curl, and the Python gRPC
# client when TANDEM_PY_GEN is set) must be installed: the test fails and
# names the package otherwise (tests/support/require.sh).
set -euo pipefail

: "${TANDEMCTL:?}" "${TANDEM_COORDINATOR_BIN:?}" "${TANDEM_WORKER_BIN:?}"
TI_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$TI_DIR/../support/require.sh"
require_program curl curl
if [[ -n "${TANDEM_PY_GEN:-}" ]]; then
  require_python_module grpc python3-grpcio
  require_python_module google.protobuf python3-protobuf
  [[ -d "$TANDEM_PY_GEN" ]] ||
    { echo "FAIL: no Python stubs in $TANDEM_PY_GEN: build the target tandem_python_stubs" >&2; exit 1; }
fi
WORK="$(mktemp -d "${TMPDIR:-/tmp}/tandem-it.XXXXXX")"
STARTED_PIDS=()
GRPC_ADDR=""
METRICS_ADDR=""
COORD_PID=""

log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
fail() {
  log "FAIL: $*"
  local f
  for f in "$WORK"/coordinator.log "$WORK"/events-*.jsonl "$WORK"/watch-*.log "$WORK"/worker-*.log; do
    [[ -f "$f" ]] || continue
    echo "--- $f (tail)" >&2
    case $f in
      */coordinator.log) tail -n 60 "$f" >&2 ;;
      *.jsonl) event_lines <"$f" | tail -n 25 >&2 ;;
      *) tail -n 15 "$f" >&2 ;;
    esac
  done
  exit 1
}

cleanup() {
  local rc=$?
  set +e
  for pid in "${STARTED_PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done
  for _ in $(seq 1 100); do
    local alive=0
    for pid in "${STARTED_PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive == 0)) && break
    sleep 0.1
  done
  for pid in "${STARTED_PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null; done
  wait 2>/dev/null
  # A failed run keeps its logs; KEEP_WORK=1 keeps a passing run's too.
  if [[ $rc -eq 0 && -z "${KEEP_WORK:-}" ]]; then rm -rf "$WORK"; else log "kept $WORK"; fi
  exit $rc
}
trap cleanup EXIT
# `timeout` and ctest stop a test with SIGTERM: exit through the cleanup.
trap 'exit 143' TERM
trap 'exit 130' INT

# make_tokens: admin.token and join.token (0600) in $WORK.
make_tokens() {
  umask 077
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$WORK/admin.token"
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$WORK/join.token"
}

# start_coordinator [extra flags]: starts it on $WORK/state, waits for the ready line.
start_coordinator() {
  [[ -f "$WORK/admin.token" ]] || make_tokens
  : > "$WORK/coordinator.out"
  setsid "$TANDEM_COORDINATOR_BIN" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --state-dir "$WORK/state" --admin-token-file "$WORK/admin.token" \
    --join-token-file "$WORK/join.token" "$@" \
    >>"$WORK/coordinator.out" 2>>"$WORK/coordinator.log" &
  COORD_PID=$!
  STARTED_PIDS+=("$COORD_PID")
  local line=""
  for _ in $(seq 1 300); do
    line=$(grep -m1 '^tandem-coordinator listening' "$WORK/coordinator.out" || true)
    [[ -n "$line" ]] && break
    kill -0 "$COORD_PID" 2>/dev/null || fail "coordinator exited during start-up"
    sleep 0.1
  done
  [[ -n "$line" ]] || fail "coordinator printed no ready line in 30 s"
  GRPC_ADDR=$(sed -n 's/.*grpc=\([^ ]*\).*/\1/p' <<<"$line")
  METRICS_ADDR=$(sed -n 's/.*metrics=\([^ ]*\).*/\1/p' <<<"$line")
  : > "$WORK/coordinator.out"  # the next start appends a fresh ready line
  log "coordinator pid $COORD_PID grpc=$GRPC_ADDR metrics=$METRICS_ADDR"
}

# start_worker NAME [extra flags]: prints nothing; sets LAST_WORKER_PID.
start_worker() {
  local name=$1
  shift
  setsid "$TANDEM_WORKER_BIN" --coordinator "$GRPC_ADDR" --name "$name" --device cpu \
    --data-address 127.0.0.1 --threads 1 --token-file "$WORK/join.token" "$@" \
    >>"$WORK/worker-$name.log" 2>&1 &
  LAST_WORKER_PID=$!
  STARTED_PIDS+=("$LAST_WORKER_PID")
}

# ctl ARGS: tandemctl against the test coordinator with the admin token.
ctl() { "$TANDEMCTL" --coordinator "$GRPC_ADDR" --token-file "$WORK/admin.token" "$@"; }

# wait_until SECONDS CMD...: polls CMD every 0.2 s until it succeeds, for at
# most SECONDS of wall time (a slow CMD, e.g. a tandemctl call on a loaded
# machine, is polled less often, never for longer).
wait_until() {
  local secs=$1
  shift
  local deadline=$((SECONDS + secs))
  for _ in $(seq 1 $((secs * 5))); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
  return 1
}

# follow_job NAME JOB: `tandemctl watch --output json JOB` in the background
# (at most 240 s): every event of the job from the watch's start on, one JSON
# line in $WORK/events-NAME.jsonl, in the coordinator's order, as it happens
# (the first line is a snapshot of where the job was then). Tests key on
# these events instead of polling the job with tandemctl calls, which a fast
# job outruns on a loaded machine. Sets FOLLOW_PID; `wait $FOLLOW_PID` gives
# the job's outcome (0 SUCCEEDED).
follow_job() {
  setsid timeout 240 "$TANDEMCTL" --coordinator "$GRPC_ADDR" --token-file "$WORK/admin.token" \
    --output json watch "$2" >"$WORK/events-$1.jsonl" 2>>"$WORK/watch-$1.log" &
  FOLLOW_PID=$!
  STARTED_PIDS+=("$FOLLOW_PID")
}
# The checks below are polled: each reads the raw file once, with no pipe
# (with pipefail a reader that stops early would fail it) and no slow regex.
# event_seen NAME TEXT: some event's message so far contains TEXT (as the
# JSON has it: TEXT without quotes, backslashes or <>&').
event_seen() {
  TEXT=$2 awk '{ m = index($0, "\"message\":\""); if (m && index(substr($0, m), ENVIRON["TEXT"])) { ok = 1; exit } }
    END { exit !ok }' "$WORK/events-$1.jsonl"
}
# stepped_after NAME TEXT: a step event follows the first event whose message contains TEXT.
stepped_after() {
  TEXT=$2 awk 'seen && index($0, "\"kind\":\"step\"") { ok = 1; exit }
    { m = index($0, "\"message\":\""); if (m && index(substr($0, m), ENVIRON["TEXT"])) seen = 1 }
    END { exit !ok }' "$WORK/events-$1.jsonl"
}
# followed_step NAME: the newest step the followed job has reported (0 before any).
followed_step() {
  awk 'match($0, /"metrics":\{"step":"[0-9]+"/) { s = substr($0, RSTART + 19, RLENGTH - 20) } END { print s + 0 }' \
    "$WORK/events-$1.jsonl"
}
step_at_least() { (($(followed_step "$1") >= $2)); }
# event_lines: JSON events on stdin -> one "[kind] message" line each (the
# escapes protobuf's JSON printer uses in messages undone).
event_lines() {
  sed -n -e 's/^{"job_id":"[^"]*","time":[^,]*,"kind":"\([a-z]*\)","message":"\(\([^"\\]\|\\.\)*\)".*/[\1] \2/' \
    -e 't found' -e 'd' -e ':found' \
    -e 's/\\u003c/</g; s/\\u003e/>/g; s/\\u0026/\&/g; s/\\u0027/'"'"'/g; s/\\"/"/g; s/\\\\/\\/g; p'
}
# job_events NAME: the followed job's events so far, one "[kind] message" line each.
job_events() { event_lines <"$WORK/events-$1.jsonl"; }

# Number of workers in STATE (IDLE, BUSY, LOST, ...).
workers_in_state() { ctl workers --output json | grep -c "\"state\":\"WORKER_STATE_$1\"" || true; }
workers_idle_at_least() { (($(workers_in_state IDLE) >= $1)); }
job_state() { ctl status "$1" --output json | sed -n 's/.*"state":"JOB_STATE_\([A-Z]*\)".*/\1/p' | head -1; }
job_in_state() { [[ "$(job_state "$1")" == "$2" ]]; }

# healthy: the coordinator process is alive, /healthz answers, and gRPC
# health (the Python client when TANDEM_PY_GEN is set, as under ctest; else
# a Control call) is SERVING.
healthy() {
  kill -0 "$COORD_PID" 2>/dev/null || fail "coordinator died"
  curl -sf --max-time 5 "http://$METRICS_ADDR/healthz" >/dev/null || fail "/healthz failed"
  if [[ -n "${TANDEM_PY_GEN:-}" ]]; then
    TANDEM_PY_GEN="$TANDEM_PY_GEN" timeout 20 /usr/bin/python3 "$TI_DIR/../python/health_check.py" "$GRPC_ADDR" \
      || fail "grpc health check failed"
  else
    ctl jobs >/dev/null || fail "coordinator does not answer Control calls"
  fi
}

# expect_exit CODE CMD...: runs CMD (output to $WORK/out.txt), checks its exit code.
expect_exit() {
  local want=$1
  shift
  local got=0
  "$@" >"$WORK/out.txt" 2>&1 || got=$?
  if [[ "$got" != "$want" ]]; then
    cat "$WORK/out.txt" >&2
    fail "expected exit $want, got $got: $*"
  fi
}
# signal_and_wait SIG PID...: sends SIG, waits up to 15 s for each PID to exit
# (then SIGKILL and fail). Returns nothing; sets LAST_RCS to their exit codes.
signal_and_wait() {
  local sig=$1
  shift
  kill "-$sig" "$@" 2>/dev/null || true
  LAST_RCS=()
  for pid in "$@"; do
    local n=0
    while kill -0 "$pid" 2>/dev/null && ((n < 150)); do sleep 0.1; n=$((n + 1)); done
    if kill -0 "$pid" 2>/dev/null; then
      kill -KILL "$pid" 2>/dev/null || true
      fail "pid $pid still running 15 s after SIG$sig"
    fi
    local rc=0
    wait "$pid" 2>/dev/null || rc=$?
    LAST_RCS+=("$rc")
  done
}
expect_output() { grep -q -- "$1" "$WORK/out.txt" || { cat "$WORK/out.txt" >&2; fail "output lacks '$1'"; }; }

# worker_pid NAME RUN: the pid of the tandem-worker of run dir RUN with --name NAME (from /proc:
# its token file lies in the run dir).
worker_pid() {
  local name=$1 run=$2 p args
  for p in /proc/[0-9]*; do
    args=$(tr '\0' '\n' <"$p/cmdline" 2>/dev/null) || continue
    [[ "$(head -n 1 <<<"$args")" == *tandem-worker ]] || continue
    grep -qxF -- "$run/join.token" <<<"$args" || continue
    [[ "$(grep -A1 -xF -- --name <<<"$args" | tail -n 1)" == "$name" ]] || continue
    echo "${p#/proc/}"
    return 0
  done
  return 1
}
