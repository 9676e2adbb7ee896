#!/usr/bin/env bash
# Shared helpers for the integration tests: real tandem-coordinator,
# tandem-worker and tandemctl processes on 127.0.0.1 with ephemeral ports.
# The coordinator and the workers are started, signalled and stopped by the
# one launcher of test clusters, tests/support/cluster.py (its command line,
# rooted in $WORK; its description is $WORK/cluster.json); anything else a
# test starts runs in its own process group. The EXIT trap stops it all;
# every wait is bounded. Binaries come from the environment (set by
# tests/integration/CMakeLists.txt): TANDEMCTL, TANDEM_COORDINATOR_BIN,
# TANDEM_WORKER_BIN; optional TANDEM_PY_GEN for the gRPC health check. What
# the helpers call (python3, curl, and the Python gRPC client when
# TANDEM_PY_GEN is set) must be installed: the test fails and names the
# package otherwise (tests/support/require.sh).
set -euo pipefail

: "${TANDEMCTL:?}" "${TANDEM_COORDINATOR_BIN:?}" "${TANDEM_WORKER_BIN:?}"
TI_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$TI_DIR/../support/require.sh"
require_program curl curl
require_program /usr/bin/python3 python3
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

# cluster CMD ARGS: tests/support/cluster.py CMD on this test's cluster.
cluster() { /usr/bin/python3 "$TI_DIR/../support/cluster.py" "$1" --dir "$WORK" "${@:2}"; }
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
  [[ -f "$WORK/cluster.json" ]] && cluster down >/dev/null
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

# start_coordinator [extra flags]: starts it (through the launcher) on
# $WORK/state and waits until /readyz answers; sets COORD_PID, GRPC_ADDR,
# METRICS_ADDR. Started again after it stopped, it listens on the same gRPC
# port (the workers' address stays valid), with the flags it had unless new
# ones are given.
start_coordinator() {
  cluster start-coordinator -- "$@" >/dev/null || fail "coordinator did not start"
  COORD_PID=$(cluster get members.coordinator.pid)
  GRPC_ADDR=$(cluster get grpc)
  METRICS_ADDR=$(cluster get metrics)
  log "coordinator pid $COORD_PID grpc=$GRPC_ADDR metrics=$METRICS_ADDR"
}

# start_worker NAME [extra flags]: starts it (through the launcher), does not
# wait for it to register; sets LAST_WORKER (its name) and LAST_WORKER_PID.
start_worker() {
  local name=$1
  shift
  cluster start-worker "$name" -- "$@" >/dev/null || fail "worker $name did not start"
  LAST_WORKER=$name
  LAST_WORKER_PID=$(member_pid "$name")
}

# member_pid NAME: the pid of a member of the cluster ("coordinator" or a worker's name).
member_pid() { cluster get "members.$1.pid"; }
# kill_member SIG NAME: sends SIG to the member; returns at once.
kill_member() { cluster signal "$2" --signal "$1" >/dev/null; }
# stop_member SIG NAME [SECONDS]: sends SIG, waits (15 s by default) until the
# member ended (else fails the test); sets LAST_RC to its exit code.
stop_member() {
  LAST_RC=$(cluster signal "$2" --signal "$1" --wait-exit "${3:-15}") || fail "$2 still running after SIG$1"
}
# wait_workers STATE SECONDS NAME...: until each named worker is listed in STATE.
wait_workers() { cluster wait-workers --state "$1" --timeout "$2" "${@:3}" >/dev/null; }

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
# worker_step NAME JOB GEN: the newest training step worker NAME has started
# for JOB in generation GEN (0 before any), from its own log (written as the
# step starts; the event stream can lag it by seconds on a loaded machine).
worker_step() {
  awk -v pat="job $2 gen $3 PHASE_SFT_STEP step " \
    '{ i = index($0, pat); if (i) s = substr($0, i + length(pat)) + 0 } END { print s + 0 }' "$WORK/worker-$1.log"
}
worker_step_at_least() { (($(worker_step "$1" "$2" "$3") >= $4)); }
# event_lines: JSON events on stdin -> one "[kind] message" line each (the
# escapes protobuf's JSON printer uses in messages undone).
event_lines() {
  sed -n -e 's/^{"job_id":"[^"]*","time":[^,]*,"kind":"\([a-z]*\)","message":"\(\([^"\\]\|\\.\)*\)".*/[\1] \2/' \
    -e 't found' -e 'd' -e ':found' \
    -e 's/\\u003c/</g; s/\\u003e/>/g; s/\\u0026/\&/g; s/\\u0027/'"'"'/g; s/\\"/"/g; s/\\\\/\\/g; p'
}
# job_events NAME: the followed job's events so far, one "[kind] message" line each.
job_events() { event_lines <"$WORK/events-$1.jsonl"; }

# metric_sum NAME [TEXT...]: the sum of the coordinator's /metrics samples of
# NAME whose line contains every TEXT (e.g. 'grpc_method="GetJobLogs"').
metric_sum() {
  local name=$1
  shift
  local IFS=$'\x1f'
  curl -sf --max-time 5 "http://$METRICS_ADDR/metrics" |
    NAME="$name" TEXTS="$*" awk 'BEGIN { n = split(ENVIRON["TEXTS"], t, "\x1f") }
      index($0, ENVIRON["NAME"] "{") == 1 || $1 == ENVIRON["NAME"] {
        for (i = 1; i <= n; i++) if (!index($0, t[i])) next
        s += $NF
      }
      END { print s + 0 }'
}
metric_above() { (($(metric_sum "$1" "${@:3}") > $2)); }

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
# signal_and_wait SIG PID|NAME...: sends SIG, waits up to 15 s for each to
# exit (then SIGKILL and fail): a PID is a child of this shell, a NAME a
# member of the cluster. Returns nothing; sets LAST_RCS to their exit codes.
signal_and_wait() {
  local sig=$1
  shift
  local pids=() names=() x
  for x in "$@"; do if [[ $x =~ ^[0-9]+$ ]]; then pids+=("$x"); else names+=("$x"); fi; done
  ((${#pids[@]} == 0)) || kill "-$sig" "${pids[@]}" 2>/dev/null || true
  for x in "${names[@]}"; do kill_member "$sig" "$x"; done
  LAST_RCS=()
  for x in "${names[@]}"; do
    LAST_RCS+=("$(cluster wait-exit "$x" --timeout 15)") || fail "$x still running 15 s after SIG$sig"
  done
  for pid in "${pids[@]}"; do
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
