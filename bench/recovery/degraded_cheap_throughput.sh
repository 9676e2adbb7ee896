#!/usr/bin/env bash
# MeCeFO's cheaper mode under a failure: 1 of 4 workers lost.
#
# Usage: bench/recovery/degraded_cheap_throughput.sh [BIN_DIR]   (default build/bin)
#
# For each mode a 4-worker ZeRO-0 SFT job (bench/recovery/sft-reverse.yaml)
# runs; at step KILL_AT worker d is killed with SIGKILL and the job goes on
# degraded on the 3 others (one of them computes the lost share too) until
# train.steps. No spare joins. Modes:
#   exact     the taken-over share is computed exactly
#   cheap     recovery.degraded_cheap_backward: no attention backward and
#             MLP recomputation for the taken-over share
#   cheap-lr  cheap plus recovery.degraded_low_rank=LOW_RANK
# Prints steps/s before the kill and while degraded, and the forward/backward
# seconds per step of the slowest rank (the survivor with two shares) and the
# fastest one (from metrics compute_seconds_max/min), which isolate the extra
# work from the CPU oversubscription of 4 one-thread workers on a small
# machine. Real processes on 127.0.0.1.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="$(cd "${1:-$ROOT/build/bin}" && pwd)"
export TANDEMCTL="$BIN/tandemctl" TANDEM_COORDINATOR_BIN="$BIN/tandem-coordinator" TANDEM_WORKER_BIN="$BIN/tandem-worker"
export OMP_WAIT_POLICY=PASSIVE
source "$ROOT/tests/integration/lib.sh"
KILL_AT=${KILL_AT:-40}
STEPS=${STEPS:-120}
LOW_RANK=${LOW_RANK:-32}
JOB="$(dirname "$0")/sft-reverse.yaml"
start_coordinator --lease-ms 2000 --heartbeat-ms 250
echo "| mode | steps/s before (steps) | steps/s degraded (steps) | throughput loss | fwd+bwd s/step before: slowest / fastest rank | degraded: survivor with 2 shares / fastest rank | survivor's extra work |"
echo "|---|---|---|---|---|---|---|"
n=0
for mode in ${MODES:-exact cheap cheap-lr}; do
  n=$((n + 1))
  for w in a b c d; do
    start_worker "$w$n"
  done
  wait_until 30 workers_idle_at_least 4 || fail "workers did not register"
  extra=()
  [[ $mode == cheap* ]] && extra+=(--set recovery.degraded_cheap_backward=true)
  [[ $mode == cheap-lr ]] && extra+=(--set "recovery.degraded_low_rank=$LOW_RANK")
  ID=$(ctl submit "$JOB" --set cluster.workers=4 --set "train.steps=$STEPS" --set checkpoint.every=1000 \
    "${extra[@]}" --set "name=degraded4-$mode")
  "$TANDEMCTL" --coordinator "$GRPC_ADDR" --token-file "$WORK/admin.token" --output json watch "$ID" \
    >"$WORK/events-$mode.jsonl" 2>/dev/null &
  WATCH=$!
  steps_seen() { (($(grep -c '"kind": *"step"' "$WORK/events-$mode.jsonl" || true) >= KILL_AT)); }
  for _ in $(seq 1 1200); do steps_seen && break; sleep 0.5; done
  steps_seen || fail "no progress"
  KILL_T=$(date +%s.%N)
  kill_member KILL "d$n"
  wait "$WATCH" || true
  job_in_state "$ID" SUCCEEDED || fail "$mode job is $(job_state "$ID")"
  signal_and_wait TERM "a$n" "b$n" "c$n"
  python3 - "$WORK/events-$mode.jsonl" "$KILL_T" "$mode" <<'PY'
import json, statistics, sys
path, kill_t, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
steps = []  # (step, wall, compute max, compute min)
for line in open(path):
    line = line.strip()
    if not line.startswith("{"):
        continue
    ev = json.loads(line)
    m = ev.get("metrics", {})
    x = m.get("extra", {})
    if ev.get("kind") != "step" or not m.get("step") or "warmup" in x or "baseline" in x:
        continue
    steps.append((int(m["step"]), float(m["wall_time"]), x.get("compute_seconds_max"), x.get("compute_seconds_min")))
steps = [s for s in steps if s[0] >= 5]  # past start-up

def rate(sel):
    if len(sel) < 3:
        return float("nan"), 0
    return (sel[-1][0] - sel[0][0]) / (sel[-1][1] - sel[0][1]), len(sel)

before = [s for s in steps if s[1] <= kill_t]
after = [s for s in steps if s[1] > kill_t][2:]  # past the recovery and the redone step
rb, nb = rate(before)
rd, nd = rate(after)
med = lambda sel, i: statistics.median([s[i] for s in sel if s[i] is not None])
bmax, bmin, dmax, dmin = med(before, 2), med(before, 3), med(after, 2), med(after, 3)
print(f"| {mode} | {rb:.2f} ({nb}) | {rd:.2f} ({nd}) | {100 * (1 - rd / rb):.0f}% | "
      f"{bmax:.3f} / {bmin:.3f} s | {dmax:.3f} / {dmin:.3f} s | +{100 * (dmax / dmin - 1):.0f}% |")
PY
done
log "done"
