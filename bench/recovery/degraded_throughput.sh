#!/usr/bin/env bash
# Throughput under a failure with degraded continuation (MeCeFO).
#
# Usage: bench/recovery/degraded_throughput.sh [BIN_DIR]   (default build/bin)
#
# For each mode (exact: the survivor computes the lost share exactly;
# cheap: it skips the attention backward for the taken-over share) a
# 2-worker ZeRO-0 SFT job runs; at step KILL_AT worker b is killed with
# SIGKILL, the job goes on degraded on worker a; DEGRADED_S seconds later a
# spare registers and the job grows back. Prints steps/s before the kill,
# while degraded and after the grow back, the time from kill to the first
# degraded step and the grow-back pause. Real processes on 127.0.0.1.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="$(cd "${1:-$ROOT/build/bin}" && pwd)"
export TANDEMCTL="$BIN/tandemctl" TANDEM_COORDINATOR_BIN="$BIN/tandem-coordinator" TANDEM_WORKER_BIN="$BIN/tandem-worker"
export OMP_WAIT_POLICY=PASSIVE
source "$ROOT/tests/integration/lib.sh"
KILL_AT=${KILL_AT:-60}
DEGRADED_S=${DEGRADED_S:-20}
STEPS=${STEPS:-220}
JOB="$(dirname "$0")/sft-reverse.yaml"
start_coordinator --lease-ms 2000 --heartbeat-ms 250
echo "| mode | steps/s before the kill (steps) | steps/s degraded (steps) | loss | steps/s after growing back (steps) | kill -> first degraded step done | grow-back pause |"
echo "|---|---|---|---|---|---|---|"
n=0
for mode in ${MODES:-exact cheap}; do
  n=$((n + 1))
  start_worker "a$n"
  start_worker "b$n"
  wait_until 30 workers_idle_at_least 2 || fail "workers did not register"
  extra=()
  [[ $mode == cheap ]] && extra=(--set recovery.degraded_cheap_backward=true)
  ID=$(ctl submit "$JOB" --set "train.steps=$STEPS" "${extra[@]}" --set "name=degraded-$mode")
  "$TANDEMCTL" --coordinator "$GRPC_ADDR" --token-file "$WORK/admin.token" --output json watch "$ID" \
    >"$WORK/events-$mode.jsonl" 2>/dev/null &
  WATCH=$!
  # Poll the event stream, not tandemctl: a CLI call per poll would steal CPU
  # from the two workers on this 2-core machine and slow the baseline.
  steps_seen() { (($(grep -c '"kind": *"step"' "$WORK/events-$mode.jsonl" || true) >= KILL_AT)); }
  for _ in $(seq 1 600); do steps_seen && break; sleep 0.5; done
  steps_seen || fail "no progress"
  KILL_T=$(date +%s.%N)
  kill_member KILL "b$n"
  sleep "$DEGRADED_S"
  start_worker "c$n"
  wait "$WATCH" || true
  job_in_state "$ID" SUCCEEDED || fail "$mode job is $(job_state "$ID")"
  # No idle worker may be left for the next mode.
  signal_and_wait TERM "a$n" "c$n"
  python3 - "$WORK/events-$mode.jsonl" "$KILL_T" "$mode" <<'PY'
import json, sys
path, kill_t, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
steps, degraded_t, grow_t, recovered = [], None, None, []
for line in open(path):
    line = line.strip()
    if not line.startswith("{"):
        continue
    ev = json.loads(line)
    kind, msg = ev.get("kind"), ev.get("message", "")
    m = ev.get("metrics", {})
    if kind == "step" and "extra" in m and ("warmup" in m["extra"] or "baseline" in m["extra"]):
        continue
    if kind == "step" and m.get("step"):
        steps.append((int(m["step"]), float(m["wall_time"])))
    elif kind == "recovery" and msg.startswith("degraded:") and degraded_t is None:
        degraded_t = float(ev.get("time", 0) or 0)
    elif kind == "recovery" and msg.startswith("growing back") and grow_t is None:
        grow_t = float(ev.get("time", 0) or 0)
    elif kind == "recovery" and msg.startswith("recovered in"):
        recovered.append(float(m.get("extra", {}).get("recovery_seconds", 0)))

def rate(a, b):
    sel = [(s, t) for s, t in steps if a <= t <= b]
    if len(sel) < 3:
        return float("nan"), 0
    return (sel[-1][0] - sel[0][0]) / (sel[-1][1] - sel[0][1]), len(sel)

steps = [(s, t) for s, t in steps if s >= 5]  # past start-up
before, nb = rate(0, kill_t)
after_kill = [t for s, t in steps if t > kill_t]
first_degraded = after_kill[0] if after_kill else float("nan")
grow_start = grow_t or float("inf")
degr, nd = rate(first_degraded, grow_start)
grown_steps = [t for s, t in steps if t > grow_start]
after, na = rate(grown_steps[1] if len(grown_steps) > 1 else float("inf"), float("inf"))
last_degraded = max([t for s, t in steps if t <= grow_start], default=float("nan"))
pause = (grown_steps[0] - last_degraded) if grown_steps else float("nan")
print(f"| {mode} | {before:.1f} ({nb}) | {degr:.1f} ({nd}) | {100 * (1 - degr / before):.0f}% | "
      f"{after:.1f} ({na}) | {first_degraded - kill_t:.2f} s | {pause:.2f} s |")
PY
done
log "done"
