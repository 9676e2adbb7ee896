#!/usr/bin/env bash
# tandemctl run --local writes TensorBoard event files next to
# metrics.jsonl: an independent Python reader (tfevents_read.py: framing,
# both CRCs, hand-parsed protos) finds the same scalars as metrics.jsonl,
# for a 2-worker SFT job and for a GRPO job with a warm start (negative
# steps), a baseline evaluation (step 0) and evaluations (accuracy). A step
# reported twice is covered by tfevents_unit_test.cc.
source "$(dirname "$0")/lib.sh"
require_program /usr/bin/python3 python3

RUN="$WORK/sft"
expect_exit 0 timeout 200 "$TANDEMCTL" run --local --workers 2 --run-dir "$RUN" "$TI_DIR/jobs/sft-tiny.yaml" \
  --set train.steps=6
/usr/bin/python3 "$TI_DIR/tfevents_read.py" "$RUN" || fail "SFT run: event file and metrics.jsonl differ"

RUN="$WORK/grpo"
expect_exit 0 timeout 200 "$TANDEMCTL" run --local --workers 1 --run-dir "$RUN" \
  "$TI_DIR/../../configs/grpo-arith-tiny.yaml" --set init.sft.steps=3 --set init.sft.stop_accuracy=0 \
  --set train.steps=4 --set train.eval_every=2 --set task.eval_size=8 --set train.global_batch=8 \
  --set train.micro_batch=4
grep -q '"accuracy"' "$RUN/metrics.jsonl" || { cat "$RUN/metrics.jsonl" >&2; fail "GRPO run has no accuracy"; }
/usr/bin/python3 "$TI_DIR/tfevents_read.py" "$RUN" || fail "GRPO run: event file and metrics.jsonl differ"
log "PASS"
