#!/usr/bin/env bash
# Degraded continuation (MeCeFO) with real processes: a 2-worker
# ZeRO-0 SFT job with recovery.degraded loses a worker to kill -9 and goes on
# at once on the survivor (which computes both data shares, no rollback);
# when a spare worker registers, the job checkpoints and grows back to 2
# ranks; it succeeds, and its final weights match a fault-free run's within
# fp32 tolerance (the degraded steps sum the same gradients in another order;
# the learning rate is kept low so that the training is not chaotic).
#
# The tiny job runs hundreds of steps a second, and one tandemctl call takes
# close to a second on a loaded machine: the test follows each job's events
# as they happen (follow_job), acts on them, and checks their order once the
# job is over, never where a job is at some later moment. The events reach
# the follower through the coordinator, which a loaded machine can delay by
# seconds (the rest of the job): where the test must act at a given step, it
# reads the step from worker a's own log, written as the step starts. To grow
# back, a new worker must register before the job ends, which a loaded
# machine can delay past the job's last step: the test freezes the survivor
# (SIGSTOP) while the new worker registers and thaws it (SIGCONT) after, well
# inside its lease.
source "$(dirname "$0")/lib.sh"
require_program python3 python3  # compare_safetensors.py
JOB="$TI_DIR/jobs/sft-tiny.yaml"
STEPS=${STEPS:-1200}
# The killed worker is detected by the survivor's failed collective (well
# under a second) or, when the kill falls between two steps, by its lease.
# On a 2-core machine with several jobs beside the test a live worker's
# heartbeat can be starved for over 2 s, and the survivor is frozen for up to
# 8 s below: a 15 s lease drops neither.
start_coordinator --lease-ms 15000 --heartbeat-ms 500
start_worker a
start_worker b
VICTIM=$LAST_WORKER
wait_until 30 workers_idle_at_least 2 || fail "workers did not register"
COMMON=(--workers 2 --set cluster.zero_stage=0 --set "train.steps=$STEPS" --set train.lr=3e-4 --set checkpoint.every=50
        --set checkpoint.keep=2 --set task.eval_size=8)

# grow_back_with JOB NEW: freezes worker a (the job's only rank now), starts
# worker NEW, waits until it is idle (at most 8 s) and thaws a: the job cannot
# end before NEW is there to grow back to.
grow_back_with() {
  kill_member STOP a
  start_worker "$2"
  wait_workers IDLE 8 "$2" || log "worker $2 not idle after 8 s; thawing a anyway"
  kill_member CONT a
  log "worker $2 registered while worker a was frozen at step $(worker_step a "$1" 2)"
}

# check_order FILE WHAT ERE...: FILE (job_events lines) has an event matching
# each ERE, each after the one before; sets EVENT_AT[i] to the line of the i-th.
check_order() {
  local file=$1 what=$2 prev=0 n
  shift 2
  EVENT_AT=()
  for re in "$@"; do
    n=$(RE="$re" awk -v from="$prev" 'NR > from && $0 ~ ENVIRON["RE"] { print NR; exit }' "$file")
    [[ -n "$n" ]] || fail "$what: no event matching '$re' after line $prev of $file"
    EVENT_AT+=("$n")
    prev=$n
  done
}

REF=$(ctl submit "$JOB" "${COMMON[@]}" --set name=reference --set "output_dir=$WORK/ref")
follow_job ref "$REF"
wait "$FOLLOW_PID" || fail "reference job: $(job_events ref | tail -5)"
log "reference job done"

ID=$(ctl submit "$JOB" "${COMMON[@]}" --set name=degraded --set recovery.degraded=true \
  --set "output_dir=$WORK/deg")
follow_job deg "$ID"
WATCH=$FOLLOW_PID
wait_until 60 worker_step_at_least a "$ID" 1 120 || fail "job made no progress"
kill_member KILL "$VICTIM"
log "killed worker b at step $(worker_step a "$ID" 1)"
# The spare starts once the survivor runs steps on its own.
wait_until 40 worker_step_at_least a "$ID" 2 1 || fail "no degraded continuation: $(job_events deg | tail -3)"
grow_back_with "$ID" c
wait "$WATCH" || fail "degraded job did not succeed: $(job_events deg | tail -5)"
job_in_state "$ID" SUCCEEDED || fail "job is $(job_state "$ID")"
job_events deg >"$WORK/events-deg.txt"
check_order "$WORK/events-deg.txt" "degraded job" \
  "^\[recovery\] recovering \(generation 1 -> 2, attempt 1\)" \
  "^\[recovery\] degraded: generation 2 continues on 1 of 2 ranks .*restoring the survivors' live state" \
  "^\[recovery\] recovered in .* from live memory; resuming at step [0-9]+ \(0 steps redone\)" \
  "^\[recovery\] growing back to 2 of 2 ranks \(degraded mode ends\): generation 3 .*; restoring step [0-9]+ from disk" \
  "^\[state\] job succeeded"
(($(grep -c "^\[recovery\] recovering (" "$WORK/events-deg.txt") == 2)) \
  || fail "degraded job: recoveries other than the loss and the grow back: $(grep "^\[recovery\]" "$WORK/events-deg.txt")"
FIRST=$(sed -n "${EVENT_AT[2]}s/.*resuming at step \([0-9]*\).*/\1/p" "$WORK/events-deg.txt")
LAST=$(sed -n "${EVENT_AT[3]}s/.*restoring step \([0-9]*\) from disk.*/\1/p" "$WORK/events-deg.txt")
((LAST >= FIRST)) || fail "no step ran degraded (resumed at $FIRST, grew back at $LAST)"
log "degraded: steps $FIRST-$LAST on 1 of 2 ranks, then 2 of 2"
grep -E "degraded|growing back|recovered in|checkpoint of step" "$WORK/events-deg.txt" | head -20 >&2
python3 "$TI_DIR/compare_safetensors.py" "$WORK/ref/model.safetensors" "$WORK/deg/model.safetensors" \
  --max-abs "${MAX_ABS:-1e-4}" || fail "degraded run's final weights differ from the fault-free run's"

# An elastic ZeRO-2 job (min_workers 1) shrinks after its replacement timeout
# and grows back, from a checkpoint of the current step, when a worker is idle.
VICTIM2=$LAST_WORKER  # worker c
EL=$(ctl submit "$JOB" "${COMMON[@]}" --set name=elastic --set cluster.zero_stage=2 --set cluster.min_workers=1 \
  --set recovery.replacement_timeout_ms=1000 --set "output_dir=$WORK/el")
follow_job el "$EL"
WATCH=$FOLLOW_PID
wait_until 60 worker_step_at_least a "$EL" 1 120 || fail "elastic job made no progress"
kill_member KILL "$VICTIM2"
log "killed worker c at step $(worker_step a "$EL" 1)"
# As above: the new worker starts once the shrunk job runs steps.
wait_until 40 worker_step_at_least a "$EL" 2 1 || fail "no elastic continuation: $(job_events el | tail -3)"
grow_back_with "$EL" d
wait "$WATCH" || fail "elastic job did not succeed: $(job_events el | tail -5)"
job_events el >"$WORK/events-el.txt"
check_order "$WORK/events-el.txt" "elastic job" \
  "^\[recovery\] recovering \(generation 1 -> 2, attempt 1\)" \
  "^\[recovery\] generation 2 on [^ ]+ \(elastic: 1 of 2 ranks\); restoring step [0-9]+ from disk" \
  "^\[recovery\] recovered in .*; resuming at step [0-9]+" \
  "^\[recovery\] growing back to 2 of 2 ranks: generation 3 .*; restoring step [0-9]+ from disk" \
  "^\[state\] job succeeded"
(($(grep -c "^\[recovery\] recovering (" "$WORK/events-el.txt") == 2)) \
  || fail "elastic job: recoveries other than the loss and the grow back: $(grep "^\[recovery\]" "$WORK/events-el.txt")"
FIRST=$(sed -n "${EVENT_AT[2]}s/.*resuming at step \([0-9]*\).*/\1/p" "$WORK/events-el.txt")
LAST=$(sed -n "${EVENT_AT[3]}s/.*restoring step \([0-9]*\) from disk.*/\1/p" "$WORK/events-el.txt")
((LAST >= FIRST)) || fail "no step ran elastic (resumed at $FIRST, grew back at $LAST)"
log "elastic: steps $FIRST-$LAST on 1 of 2 ranks, then 2 of 2"
grep -E "elastic|growing back|recovered in" "$WORK/events-el.txt" | head -10 >&2
python3 "$TI_DIR/compare_safetensors.py" "$WORK/ref/model.safetensors" "$WORK/el/model.safetensors" \
  --max-abs "${MAX_ABS:-1e-4}" || fail "elastic run's final weights differ from the fault-free run's"
healthy
log "PASS"
