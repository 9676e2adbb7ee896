#!/usr/bin/env bash
# The memory options through real processes (`tandemctl run --local`: a
# coordinator and 2 workers): a short GRPO run of the main job's model at
# ZeRO stage 3 with a KL term, plain, with rl.shard_reference and with
# train.activation_checkpointing: layer. Every run succeeds and exports the
# plain run's weights bit for bit (the sharded reference's log-probs and
# the recomputed gradients are bit-identical).
source "$(dirname "$0")/lib.sh"
require_program python3 python3  # compare_safetensors.py
JOB="$TI_DIR/../../configs/grpo-arith-tiny.yaml"
SHORT=(--set init.sft.steps=40 --set train.steps=6 --set train.eval_every=6
  --set task.eval_size=20 --set rl.kl_coef=0.05 --set cluster.zero_stage=3 --set checkpoint.every=0)

run_local() {  # run_local NAME [--set K=V...]: the short job, its run directory $WORK/NAME
  local name=$1
  shift
  expect_exit 0 timeout 240 "$TANDEMCTL" run --local --workers 2 "$JOB" "${SHORT[@]}" "$@" --run-dir "$WORK/$name"
  expect_output "SUCCEEDED"
}

log "--- plain"
run_local plain
log "--- rl.shard_reference"
run_local sharded --set rl.shard_reference=true
python3 "$TI_DIR/compare_safetensors.py" "$WORK/sharded/final/model.safetensors" \
  "$WORK/plain/final/model.safetensors" || fail "the sharded reference changed the trained weights"
log "--- train.activation_checkpointing: layer"
run_local layer --set train.activation_checkpointing=layer
python3 "$TI_DIR/compare_safetensors.py" "$WORK/layer/final/model.safetensors" \
  "$WORK/plain/final/model.safetensors" || fail "layer checkpointing changed the trained weights"
log "PASS"
