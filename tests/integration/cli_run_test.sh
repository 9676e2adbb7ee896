#!/usr/bin/env bash
# Submit -> run -> succeed through tandemctl with 1 and then 2 workers on a
# real coordinator: `watch` shows progress and exits 0, `logs` shows lines,
# `status`, `jobs`, `workers`, `checkpoints` answer, and the daemon stays healthy.
source "$(dirname "$0")/lib.sh"
JOB="$TI_DIR/jobs/sft-tiny.yaml"

start_coordinator
start_worker w0
start_worker w1
wait_until 30 workers_idle_at_least 2 || fail "workers did not register"
healthy

for n in 1 2; do
  log "--- $n worker(s)"
  ID=$(ctl submit "$JOB" --workers "$n" --set "name=sft-tiny-$n" --set "output_dir=$WORK/final-$n")
  [[ -n "$ID" ]] || fail "submit printed no job id"
  expect_exit 0 timeout 240 "$TANDEMCTL" --coordinator "$GRPC_ADDR" --token-file "$WORK/admin.token" watch "$ID"
  expect_output "step 4/4"
  expect_output "SUCCEEDED"
  cp "$WORK/out.txt" "$WORK/watch-$n.txt"
  [[ "$(job_state "$ID")" == SUCCEEDED ]] || fail "job $ID not SUCCEEDED"
  expect_exit 0 ctl logs "$ID"
  [[ $(wc -l <"$WORK/out.txt") -ge 3 ]] || { cat "$WORK/out.txt"; fail "logs show fewer than 3 lines"; }
  expect_exit 0 ctl status "$ID"
  expect_output "SUCCEEDED"
  expect_exit 0 ctl status "$ID" --output json
  expect_output "\"total_steps\""
  expect_exit 0 ctl checkpoints "$ID"
  [[ -f "$WORK/final-$n/config.json" ]] || fail "no config.json in the exported model $WORK/final-$n"
  ls "$WORK/final-$n"/*.safetensors >/dev/null 2>&1 || fail "no safetensors in $WORK/final-$n"
  healthy
done

expect_exit 0 ctl jobs
expect_output "sft-tiny-2"
expect_exit 0 ctl workers
expect_output "w0"
# A job that is cancelled: watch exits 3.
ID=$(ctl submit "$JOB" --workers 4 --set name=sft-cancelled)  # 4 > 2 workers: stays PENDING
wait_until 10 job_in_state "$ID" PENDING || fail "job not PENDING"
expect_exit 0 ctl status "$ID"
expect_output "needs"
timeout 60 "$TANDEMCTL" --coordinator "$GRPC_ADDR" --token-file "$WORK/admin.token" watch "$ID" \
  >"$WORK/cancel-watch.txt" 2>&1 &
WATCHER=$!
# Cancelled while watch follows it: watch has printed the job's snapshot.
wait_until 30 test -s "$WORK/cancel-watch.txt" || fail "watch printed nothing"
expect_exit 0 ctl cancel "$ID"
rc=0
wait "$WATCHER" || rc=$?
((rc == 3)) || { cat "$WORK/cancel-watch.txt" >&2; fail "watch of a cancelled job exited $rc, not 3"; }
# Its events, oldest first: the submission's state first, the cancellation last.
expect_exit 0 ctl events "$ID" --output json
[[ $(head -n 1 "$WORK/out.txt") == *'"kind":"state"'* ]] || { cat "$WORK/out.txt" >&2; fail "first event not a state"; }
[[ $(tail -n 1 "$WORK/out.txt") == *JOB_STATE_CANCELLED* ]] || { cat "$WORK/out.txt" >&2; fail "last event not CANCELLED"; }
expect_exit 0 ctl events "$ID"
expect_output "^\[state\] "
# drain: the worker takes no new job
expect_exit 0 ctl drain w1
expect_output "DRAINING"
healthy
log "PASS"
