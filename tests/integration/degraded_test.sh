#!/usr/bin/env bash
# Degraded continuation (MeCeFO, issue 6) with real processes: a 2-worker
# ZeRO-0 SFT job with recovery.degraded loses a worker to kill -9 and goes on
# at once on the survivor (which computes both data shares, no rollback);
# when a spare worker registers, the job checkpoints and grows back to 2
# ranks; it succeeds, and its final weights match a fault-free run's within
# fp32 tolerance (the degraded steps sum the same gradients in another order;
# the learning rate is kept low so that the training is not chaotic).
source "$(dirname "$0")/lib.sh"
require_program python3 python3  # compare_safetensors.py
JOB="$TI_DIR/jobs/sft-tiny.yaml"
STEPS=${STEPS:-1200}
start_coordinator --lease-ms 2000 --heartbeat-ms 250
start_worker a
start_worker b
VICTIM=$LAST_WORKER_PID
wait_until 30 workers_idle_at_least 2 || fail "workers did not register"
COMMON=(--workers 2 --set cluster.zero_stage=0 --set "train.steps=$STEPS" --set train.lr=3e-4 --set checkpoint.every=50
        --set checkpoint.keep=2 --set task.eval_size=8)
job_step() { ctl status "$1" --output json | sed -n 's/.*"step":"\{0,1\}\([0-9]*\).*/\1/p' | head -1; }
job_step_at_least() { (($(job_step "$1") >= $2)); }
events_have() { grep -q -- "$2" "$WORK/events-$1.txt"; }

REF=$(ctl submit "$JOB" "${COMMON[@]}" --set name=reference --set "output_dir=$WORK/ref")
timeout 120 "$TANDEMCTL" --coordinator "$GRPC_ADDR" --token-file "$WORK/admin.token" watch "$REF" \
  >"$WORK/events-ref.txt" 2>&1 || fail "reference job: $(tail -5 "$WORK/events-ref.txt")"
log "reference job done"

ID=$(ctl submit "$JOB" "${COMMON[@]}" --set name=degraded --set recovery.degraded=true \
  --set "output_dir=$WORK/deg")
timeout 240 "$TANDEMCTL" --coordinator "$GRPC_ADDR" --token-file "$WORK/admin.token" watch "$ID" \
  >"$WORK/events-deg.txt" 2>&1 &
WATCH=$!
wait_until 60 job_step_at_least "$ID" 120 || fail "job made no progress"
kill -KILL -- "-$VICTIM"
log "killed worker b at step $(job_step "$ID")"
wait_until 30 events_have deg "degraded: generation" || fail "no degraded continuation"
# The spare starts now: it needs about a second to register, which is
# hundreds of steps of this tiny job, so waiting for the degraded progress
# below first could let the job finish before it can grow back.
start_worker c
wait_until 30 events_have deg "recovered in" || fail "degraded setup did not finish"
grep -q "from live memory" "$WORK/events-deg.txt" || fail "degraded recovery did not keep the live state"
AT=$(job_step "$ID")
wait_until 60 job_step_at_least "$ID" $((AT + 100)) || fail "no progress while degraded"
# Running degraded, or already recovering to grow back (the spare is up).
state=$(job_state "$ID")
[[ "$state" == RUNNING || "$state" == RECOVERING ]] || fail "job is $state while degraded"
log "degraded: step $AT -> $(job_step "$ID")"
wait_until 60 events_have deg "growing back to 2 of 2 ranks" || fail "the job did not grow back"
wait "$WATCH" || fail "degraded job did not succeed: $(tail -5 "$WORK/events-deg.txt")"
job_in_state "$ID" SUCCEEDED || fail "job is $(job_state "$ID")"
grep -E "degraded|growing back|recovered in|checkpoint of step" "$WORK/events-deg.txt" | head -20 >&2
python3 "$TI_DIR/compare_safetensors.py" "$WORK/ref/model.safetensors" "$WORK/deg/model.safetensors" \
  --max-abs "${MAX_ABS:-1e-4}" || fail "degraded run's final weights differ from the fault-free run's"

# An elastic ZeRO-2 job (min_workers 1) shrinks after its replacement timeout
# and grows back, from a checkpoint of the current step, when a worker is idle.
VICTIM2=$LAST_WORKER_PID  # worker c
EL=$(ctl submit "$JOB" "${COMMON[@]}" --set name=elastic --set cluster.zero_stage=2 --set cluster.min_workers=1 \
  --set recovery.replacement_timeout_ms=1000 --set "output_dir=$WORK/el")
timeout 240 "$TANDEMCTL" --coordinator "$GRPC_ADDR" --token-file "$WORK/admin.token" watch "$EL" \
  >"$WORK/events-el.txt" 2>&1 &
WATCH=$!
wait_until 60 job_step_at_least "$EL" 120 || fail "elastic job made no progress"
kill -KILL -- "-$VICTIM2"
wait_until 30 events_have el "elastic: 1 of 2 ranks" || fail "no elastic continuation"
AT=$(job_step "$EL")
wait_until 60 job_step_at_least "$EL" $((AT + 50)) || fail "no progress while elastic"
start_worker d
wait_until 60 events_have el "growing back to 2 of 2 ranks" || fail "the elastic job did not grow back"
wait "$WATCH" || fail "elastic job did not succeed: $(tail -5 "$WORK/events-el.txt")"
grep -E "elastic|growing back|recovered in" "$WORK/events-el.txt" | head -10 >&2
python3 "$TI_DIR/compare_safetensors.py" "$WORK/ref/model.safetensors" "$WORK/el/model.safetensors" \
  --max-abs "${MAX_ABS:-1e-4}" || fail "elastic run's final weights differ from the fault-free run's"
healthy
log "PASS"
