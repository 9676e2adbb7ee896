#!/usr/bin/env bash
# Prompt tuning through real processes (tandemctl run --local, 2 workers):
# the tiny SFT job with train.soft_prompt_tokens 4 and train.trainable
# [tandem.soft_prompt] succeeds; the exported model carries the soft prompt
# (config.json tandem_soft_prompt_tokens, tensor tandem.soft_prompt) and
# every other tensor as a 2-step run of the same job leaves it; `tandemctl
# generate` runs behind it; a number the model does not have is refused.
source "$(dirname "$0")/lib.sh"
JOB="$TI_DIR/../../configs/sft-arith-tiny.yaml"
SETS=(--set train.steps=20 --set train.eval_every=0 --set cluster.threads_per_worker=1
  --set train.soft_prompt_tokens=4 --set "train.trainable=[tandem.soft_prompt]" --set train.seq_len=24)

expect_exit 0 timeout 200 "$TANDEMCTL" run --local --run-dir "$WORK/tuned" "$JOB" "${SETS[@]}"
expect_output "SUCCEEDED"
expect_exit 0 timeout 200 "$TANDEMCTL" run --local --run-dir "$WORK/start" "$JOB" "${SETS[@]}" --set train.steps=2
/usr/bin/python3 - "$WORK/start/final" "$WORK/tuned/final" <<'PY' || fail "the exported soft prompt"
import json, struct, sys
def tensors(d):
    raw = open(d + "/model.safetensors", "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    head.pop("__metadata__", None)
    return {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in head.items()}
start, tuned = tensors(sys.argv[1]), tensors(sys.argv[2])
assert json.load(open(sys.argv[2] + "/config.json"))["tandem_soft_prompt_tokens"] == 4
assert set(start) == set(tuned) and "tandem.soft_prompt" in tuned, sorted(tuned)
moved = [k for k in tuned if tuned[k] != start[k]]
assert moved == ["tandem.soft_prompt"], moved
PY
expect_exit 0 timeout 60 "$TANDEMCTL" generate --model "$WORK/tuned/final" --prompt "12+34=" --max-new-tokens 3 \
  --output json
expect_output '"soft_prompt_tokens":4'
expect_exit 2 timeout 60 "$TANDEMCTL" run --local --run-dir "$WORK/bad" "$JOB" "${SETS[@]}" \
  --set train.soft_prompt_tokens=-1
expect_output "train.soft_prompt_tokens"
log "PASS"
