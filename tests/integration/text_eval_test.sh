#!/usr/bin/env bash
# Eval accuracy on text data, with values known in advance: a tiny
# Qwen3-layout model (real Qwen3 tokenizer) is warm-started on word
# problems whose every answer is "#### 7" until it writes exactly that
# (init.sft.stop_accuracy: 1), so on an eval set of those questions with
# references 7, 7, 8 and 9 greedy pass@1 is 0.5 on 2 workers, and so is
# mean@k at a temperature low enough to sample the greedy choice. The GRPO
# step's rollouts all earn the gsm8k reward (answer and format), end by
# themselves, and are not clipped. An SFT job that starts from the
# exported model reports eval_exact_match 0.5 on the same eval set.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/text_lib.sh"
make_qwen3_model "$WORK/base"
/usr/bin/python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
names = ["Ann", "Bob", "Cleo", "Dev"]
questions = [f"{names[i % 4]} has {i + 2} apples. How many are left after some are eaten?" for i in range(16)]
with open(f"{work}/train.jsonl", "w") as f:
    for q in questions:
        f.write(json.dumps({"question": q, "answer": "#### 7"}) + "\n")
# Questions the model was trained on (this checks the metrics, not how the
# model generalises), with other references.
with open(f"{work}/eval.jsonl", "w") as f:
    for q, a in zip(questions, [7, 7, 8, 9]):
        f.write(json.dumps({"question": q, "answer": f"#### {a}"}) + "\n")
PY

cat >"$WORK/job.yaml" <<YAML
name: text-eval
kind: grpo
seed: 2
model: {from: $WORK/base}
data:
  train: $WORK/train.jsonl
  eval: $WORK/eval.jsonl
  prompt_key: question
  chat: true
  answer_key: answer
  response_key: answer
  eval_samples: 3
reward: {type: gsm8k, format_reward: 0.5}
init: {sft: {steps: 150, lr: 1.0e-2, stop_accuracy: 1.0}}
train: {steps: 1, lr: 1.0e-8, global_batch: 4, micro_batch: 2}
task: {eval_size: 4}
rl: {group_size: 2, prompts_per_step: 2, max_new_tokens: 8, temperature: 0.001, kl_coef: 0}
cluster: {workers: 2}
YAML
expect_exit 0 timeout 400 "$TANDEMCTL" run --local --workers 2 --run-dir "$WORK/run" "$WORK/job.yaml"
/usr/bin/python3 - "$WORK/run/metrics.jsonl" <<'PY' || { cat "$WORK/run/metrics.jsonl" >&2; fail "GRPO eval metrics are not what the model answers"; }
import json, sys
steps = {int(m["step"]): m for m in map(json.loads, open(sys.argv[1]))}
warm = [s for s in steps if s < 0]
print(f"warm start held after {len(warm)} of 150 steps")
assert len(warm) < 150, "the warm start never wrote '#### 7' exactly"
for s in (0, 1):  # the baseline after the warm start, and the step's eval
    e = steps[s]["extra"]
    assert e["eval_pass_at_1"] == 0.5 and steps[s]["accuracy"] == 0.5, (s, e)
    assert e["eval_mean_at_k"] == 0.5, (s, e)
e = steps[1]["extra"]
assert steps[1]["reward_mean"] == 1.5, steps[1]  # correct + format_reward, every rollout
assert e["rollout_accuracy"] == 1 and e["well_formed_fraction"] == 1, e
assert e["truncated_fraction"] == 0 and 0 < e["response_length_mean"] <= e["response_length_max"] < 8, e
assert e["clip_fraction"] == 0, e
PY

cat >"$WORK/sft.yaml" <<YAML
name: text-eval-sft
kind: sft
seed: 2
model: {from: $WORK/run/final}
data: {train: $WORK/train.jsonl, eval: $WORK/eval.jsonl, prompt_key: question, chat: true, response_key: answer}
train: {steps: 1, lr: 1.0e-8, global_batch: 4, micro_batch: 2}
task: {eval_size: 4}
cluster: {workers: 2}
YAML
expect_exit 0 timeout 300 "$TANDEMCTL" run --local --workers 2 --run-dir "$WORK/run-sft" "$WORK/sft.yaml"
/usr/bin/python3 - "$WORK/run-sft/metrics.jsonl" <<'PY' || { tail -n 2 "$WORK/run-sft/metrics.jsonl" >&2; fail "SFT eval metrics are not what the model answers"; }
import json, sys
last = [json.loads(l) for l in open(sys.argv[1])][-1]
e = last["extra"]
assert int(last["step"]) == 1 and e["eval_exact_match"] == 0.5 and last["accuracy"] == 0.5, last
assert 0 < e["eval_loss"] < 10, e  # about 0 on the 7s, high on the 8 and 9
PY
log "PASS"
