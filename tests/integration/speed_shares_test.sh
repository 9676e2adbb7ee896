#!/usr/bin/env bash
# Speed-proportional shards with real processes: two workers registered with
# different --speed hints (tandemctl workers shows them) run the tiny SFT job
# at ZeRO stage 2 with cluster.shard_by_speed; the job log names the speed
# table, and the final loss equals the even split's (the same job without
# the key) within a relative 1e-4. Bad hints stop the worker at start with
# exit 2 naming --speed; the key with sequence parallelism is refused at
# submit.
source "$(dirname "$0")/lib.sh"
JOB="$TI_DIR/jobs/sft-tiny.yaml"

for bad in 0 -1 nan 1e9; do
  expect_exit 2 timeout 30 "$TANDEM_WORKER_BIN" --coordinator 127.0.0.1:1 --name bad --speed "$bad"
  expect_output "speed"
done

start_coordinator
start_worker a --speed 1 --threads 1
start_worker b --speed 3 --threads 1
wait_until 30 workers_idle_at_least 2 || fail "workers did not register"
ctl workers >"$WORK/workers.txt" || fail "tandemctl workers failed"
grep -q "SPEED" "$WORK/workers.txt" || fail "tandemctl workers shows no SPEED column"
ctl workers --output json | grep -q '"speed":3' || fail "worker b's speed is not listed: $(ctl workers --output json)"

COMMON=(--workers 2 --set train.steps=10 --set cluster.zero_stage=2 --set task.eval_size=8)
final_loss() { grep -o '"loss":[-0-9.e]*' "$WORK/events-$1.jsonl" | tail -1 | cut -d: -f2; }
EVEN=$(ctl submit "$JOB" "${COMMON[@]}" --set name=even)
follow_job even "$EVEN"
wait "$FOLLOW_PID" || fail "even job: $(job_events even | tail -5)"
FAST=$(ctl submit "$JOB" "${COMMON[@]}" --set name=by-speed --set cluster.shard_by_speed=true)
follow_job fast "$FAST"
wait "$FOLLOW_PID" || fail "by-speed job: $(job_events fast | tail -5)"
ctl logs "$FAST" >"$WORK/fast.log" 2>&1 || true
grep -q "shard_by_speed: rank speeds \[1, 3\]\|shard_by_speed: rank speeds \[3, 1\]" "$WORK/fast.log" ||
  fail "job log names no speed table: $(tail -20 "$WORK/fast.log")"
/usr/bin/python3 - "$(final_loss even)" "$(final_loss fast)" <<'PY' || fail "final losses differ"
import sys
a, b = float(sys.argv[1]), float(sys.argv[2])
d = abs(a - b) / max(abs(a), 1e-12)
print(f"final loss even {a} by speed {b}: rel diff {d:.2e}", file=sys.stderr)
sys.exit(0 if d <= 1e-4 else 1)
PY

expect_exit 2 "$TANDEMCTL" run --local --workers 2 --run-dir "$WORK/bad" "$JOB" --set cluster.sequence_parallel=2 \
  --set cluster.shard_by_speed=true
expect_output "cluster.shard_by_speed"
log "PASS"
