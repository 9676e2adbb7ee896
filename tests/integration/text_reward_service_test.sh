#!/usr/bin/env bash
# GRPO on text data scored by an external RewardService in its own process
# (tests/integration/reward_server.py, Python grpcio): a tiny Qwen3-layout
# model with the real Qwen3 tokenizer, generated word problems with extra
# fields, `tandemctl run --local` on 2 workers. The server records every
# request; the test checks that each item carries the prompt as the chat
# template renders it (compared with `tandemctl chat-template`), the
# decoded response (compared with `tandemctl tokenize --decode` of its ids),
# the row's reference answer and its other fields (JSON values as JSON
# text), and that the step's reward_mean is the mean of what the server
# answered.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/text_lib.sh"
make_qwen3_model "$WORK/base"
make_word_problems "$WORK" train 16

start_reward_server

SYSTEM="Answer with the number after ####."
cat >"$WORK/job.yaml" <<YAML
name: text-reward-service
kind: grpo
seed: 9
model: {from: $WORK/base}
data:
  train: $WORK/train.jsonl
  prompt_key: question
  chat: true
  system_prompt: "$SYSTEM"
  answer_key: answer
  shuffle: false
task: {reward_service: "127.0.0.1:$PORT", reward_timeout_ms: 20000}
train: {steps: 2, lr: 1.0e-3, global_batch: 4, micro_batch: 2}
rl: {group_size: 2, prompts_per_step: 2, max_new_tokens: 8, kl_coef: 0}
cluster: {workers: 2}
YAML
expect_exit 0 "$TANDEMCTL" validate "$WORK/job.yaml"
RUN="$WORK/run"
expect_exit 0 timeout 300 "$TANDEMCTL" run --local --workers 2 --run-dir "$RUN" "$WORK/job.yaml"
expect_output "SUCCEEDED"
[[ -s "$WORK/requests.jsonl" ]] || fail "the reward server received no request"

# What the template renders for row i (the expected prompt text).
/usr/bin/python3 - "$WORK" "$SYSTEM" <<'PY' || fail "could not write the messages files"
import json, sys
work, system = sys.argv[1], sys.argv[2]
for i, line in enumerate(open(f"{work}/train.jsonl")):
    row = json.loads(line)
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": row["question"]}]
    json.dump(msgs, open(f"{work}/messages-{i}.json", "w"))
PY
for i in $(seq 0 15); do
  "$TANDEMCTL" chat-template --tokenizer "$RUN/final" --messages-file "$WORK/messages-$i.json" \
    --add-generation-prompt >"$WORK/prompt-$i.txt" || fail "chat-template failed for row $i"
done
# Every completion, decoded from its ids by tandemctl.
/usr/bin/python3 - "$WORK" <<'PY' || fail "could not list the completions"
import json, sys
work = sys.argv[1]
n = 0
with open(f"{work}/ids.txt", "w") as out:
    for line in open(f"{work}/requests.jsonl"):
        for it in json.loads(line)["items"]:
            out.write(" ".join(map(str, it["completion_ids"])) + "\n")
            n += 1
print(n, "completions")
PY
: >"$WORK/decoded.jsonl"
while IFS= read -r ids; do
  if [[ -z "$ids" ]]; then echo '{"text": ""}' >>"$WORK/decoded.jsonl"; continue; fi
  "$TANDEMCTL" tokenize --tokenizer "$RUN/final" --decode --text "$ids" --output json >>"$WORK/decoded.jsonl" ||
    fail "tokenize --decode failed on '$ids'"
  echo >>"$WORK/decoded.jsonl"
done <"$WORK/ids.txt"

TI_DIR="$TI_DIR" /usr/bin/python3 - "$WORK" "$RUN/metrics.jsonl" <<'PY' || fail "the reward service did not get what the job had"
import json, os, sys
work, metrics = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.environ["TI_DIR"])
from reward_server import reward
rows = [json.loads(l) for l in open(f"{work}/train.jsonl")]
decoded = [json.loads(l) for l in open(f"{work}/decoded.jsonl") if l.strip()]
requests = [json.loads(l) for l in open(f"{work}/requests.jsonl")]
tok = json.load(open(f"{work}/base/tokenizer.json"))
specials = [a["content"] for a in tok["added_tokens"] if a["special"]]
by_step = {}
k = 0
for req in requests:
    assert req["job_id"], req
    for it in req["items"]:
        row = rows[int(it["fields"]["id"])]
        # The row's other fields: strings as they are, other JSON as JSON text.
        assert set(it["fields"]) == {"id", "source", "meta"}, it["fields"]
        assert it["fields"]["source"] == "synthetic", it["fields"]
        assert json.loads(it["fields"]["meta"]) == row["meta"], it["fields"]
        assert it["reference"] == row["answer"], (it["reference"], row["answer"])
        want = open(f"{work}/prompt-{row['id']}.txt").read()
        assert it["prompt"] == want, (it["prompt"], want)
        assert row["question"] in it["prompt"]
        # The completion is the decoded text of its ids, special tokens skipped.
        text = decoded[k].get("text", "")
        for special in specials:
            text = text.replace(special, "")
        assert it["completion"] == text, (it["completion"], text, it["completion_ids"])
        assert len(it["completion_ids"]) <= 8
        if not it["terminated"]:
            assert len(it["completion_ids"]) == 8, it
        k += 1
        by_step.setdefault(req["step"], []).append(reward(it))
assert sorted(by_step) == [1, 2], sorted(by_step)
for step, rewards in by_step.items():
    assert len(rewards) == 4, (step, rewards)  # prompts_per_step * group_size, over both ranks
steps = {}
for line in open(metrics):
    m = json.loads(line)
    if "reward_mean" in m:
        steps[int(m["step"])] = m["reward_mean"]
for step, rewards in by_step.items():
    want = sum(rewards) / len(rewards)
    assert abs(steps[step] - want) < 1e-6, (step, steps.get(step), want)  # rewards are fp32 in the engine
print(f"{k} items checked over steps {sorted(by_step)}")
PY
log "PASS"
