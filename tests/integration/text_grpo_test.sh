#!/usr/bin/env bash
# GRPO on text data with a real tokenizer: a tiny Qwen3-layout model (q/k
# norms, explicit head_dim) with the real Qwen3 tokenizer and chat template
# (weights from `tandemctl model init --tokenizer`), a generated
# word-problem JSONL with "#### answer" references, an SFT warm start then
# GRPO with the gsm8k reward through `tandemctl run --local` on 2 workers.
# Checks the plumbing, not accuracy: rewards are computed from decoded text
# (the SCORE samples in the job's log - decoded response, the answer read
# from it, the reward - follow the gsm8k rule), the step metrics carry the
# text metrics, the export loads back with its tokenizer and chat template,
# and `tandemctl generate --chat` on it prints text. Then an SFT job
# evaluates on data.eval, and a bad row fails SETUP naming file and line.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/text_lib.sh"
make_qwen3_model "$WORK/base"
make_word_problems "$WORK" train 64
make_word_problems "$WORK" eval 8 11

cat >"$WORK/job.yaml" <<YAML
name: text-grpo
kind: grpo
seed: 5
model: {from: $WORK/base}
data:
  train: $WORK/train.jsonl
  eval: $WORK/eval.jsonl
  prompt_key: question
  chat: true
  system_prompt: "Answer with the number after ####."
  answer_key: answer
  response_key: answer
  max_prompt_tokens: 96
  eval_samples: 2
reward: {type: gsm8k, format_reward: 0.1}
train: {steps: 2, lr: 1.0e-3, global_batch: 4, micro_batch: 2, eval_every: 2}
init: {sft: {steps: 2}}
rl: {group_size: 2, prompts_per_step: 2, max_new_tokens: 12, kl_coef: 0, stop: ["\n\n"]}
task: {eval_size: 4}
cluster: {workers: 2}
YAML
expect_exit 0 "$TANDEMCTL" validate "$WORK/job.yaml"

RUN="$WORK/run"
expect_exit 0 timeout 400 "$TANDEMCTL" run --local --workers 2 --run-dir "$RUN" "$WORK/job.yaml"
expect_output "SUCCEEDED"
# The reward saw decoded text: the mean response length in bytes of text
# (special tokens skipped) is reported next to the length in tokens.
python3 - "$RUN/metrics.jsonl" <<'PY' || fail "no decoded response text reached the reward"
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rl = [s for s in steps if "response_chars_mean" in s.get("extra", {})]
assert len(rl) == 2, f"{len(rl)} RL steps with response_chars_mean"
assert any(s["extra"]["response_chars_mean"] > 0 for s in rl), rl
assert all(s["extra"]["response_length_mean"] > 0 for s in rl), rl
PY
# The rank-0 SCORE samples in the job's log (read back through a
# coordinator on the run's state) hold the decoded response, the answer the
# gsm8k rule read from it and the reward: check them against the rule.
cp -r "$RUN/state" "$WORK/state"
start_coordinator
JOB_ID=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['job_id'])" "$RUN/summary.json")
ctl --output json logs "$JOB_ID" >"$WORK/logs.jsonl" || fail "tandemctl logs failed"
/usr/bin/python3 - "$WORK/logs.jsonl" "$TOK/tokenizer.json" <<'PY' || fail "the SCORE samples do not follow the gsm8k rule on decoded text"
import json, re, sys
specials = [a["content"] for a in json.load(open(sys.argv[2]))["added_tokens"] if a["special"]]
pat = re.compile(r"step (\d+) sample response \(decoded, (\d+) tokens(, cut at max_new_tokens)?\): '(.*)' "
                 r"answer (none|'(.*)'), reference '(.*)', reward (-?[0-9.]+)$", re.S)
num = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")
def norm(x):
    x = x.replace("$", "").replace(",", "")
    return x[:-2] if x.endswith(".0") else x
seen = set()
for line in open(sys.argv[1]):
    text = json.loads(line).get("text", "")
    m = pat.match(text)
    if not m:
        continue
    step, ntok, cut, resp, ans, ans_text, ref, reward = m.groups()
    seen.add(int(step))
    assert int(ntok) > 0 and resp, text
    assert not any(t in resp for t in specials), f"special token in the decoded response: {text}"
    assert not re.fullmatch(r"[\d ,\[\]]+", resp), f"ids, not text: {text}"
    ref_answer = norm(ref.rsplit("####", 1)[1].strip())
    if "####" not in resp:
        nums = num.findall(resp)
        want = norm(nums[-1]) if nums else None
        assert (ans_text if ans != "none" else None) == want, (text, want)
        assert abs(float(reward) - (1.0 if want == ref_answer else 0.0)) < 1e-6, text
print("SCORE samples of steps", sorted(seen))
assert seen == {1, 2}, seen
PY

for key in reward_mean response_length_mean response_length_max truncated_fraction well_formed_fraction \
    clip_fraction prompts_dropped eval_pass_at_1 eval_mean_at_k; do
  grep -q "\"$key\"" "$RUN/metrics.jsonl" || { cat "$RUN/metrics.jsonl"; fail "metrics.jsonl lacks $key"; }
done
for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
  [[ -f "$RUN/final/$f" ]] || fail "the export lacks $f"
done
cmp -s "$TOK/tokenizer.json" "$RUN/final/tokenizer.json" || fail "the exported tokenizer.json differs"

# The export loads back with its tokenizer and chat template.
expect_exit 0 "$TANDEMCTL" generate --model "$RUN/final" --prompt "How many apples?" --chat \
  --system "Be brief." --max-new-tokens 6
expect_output "text: "
expect_exit 0 "$TANDEMCTL" generate --model "$RUN/final" --prompt "How many apples?" --chat \
  --max-new-tokens 4 --output json
expect_output '"prompt_ids"'
expect_output '"text"'
# The rendered chat prompt starts with <|im_start|> (151644 in Qwen3).
grep -q '"prompt_ids":\[151644' "$WORK/out.txt" || { cat "$WORK/out.txt"; fail "--chat did not render the template"; }

# SFT on text data evaluates on data.eval: the loss on its responses and
# the exact-match fraction, at eval_every and at the last step.
cat >"$WORK/sft.yaml" <<YAML
name: text-sft
kind: sft
seed: 5
model: {from: $WORK/base}
data: {train: $WORK/train.jsonl, eval: $WORK/eval.jsonl, prompt_key: question, chat: true, response_key: answer}
train: {steps: 4, lr: 1.0e-3, global_batch: 4, micro_batch: 2, eval_every: 2}
task: {eval_size: 6}
cluster: {workers: 2}
YAML
expect_exit 0 timeout 200 "$TANDEMCTL" run --local --workers 2 --run-dir "$WORK/run-sft" "$WORK/sft.yaml"
/usr/bin/python3 - "$WORK/run-sft/metrics.jsonl" <<'PY' || { cat "$WORK/run-sft/metrics.jsonl"; fail "SFT did not evaluate on data.eval"; }
import json, math, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ev = {int(s["step"]): s for s in steps if "eval_loss" in s.get("extra", {})}
assert sorted(ev) == [2, 4], sorted(ev)
for s in ev.values():
    assert 0 < s["extra"]["eval_loss"] < 20 and math.isfinite(s["extra"]["eval_loss"]), s
    assert 0 <= s["extra"]["eval_exact_match"] <= 1, s
    assert s.get("accuracy", 0) == s["extra"]["eval_exact_match"], s
# Training lowers the loss on the held-out responses.
assert ev[4]["extra"]["eval_loss"] < ev[2]["extra"]["eval_loss"], ev
PY

# Bad data fails at SETUP with file:line.
printf '{"question": "q", "answer": "#### 1"}\nnot json\n' >"$WORK/bad.jsonl"
expect_exit 1 timeout 200 "$TANDEMCTL" run --local --workers 1 --run-dir "$WORK/run-bad" "$WORK/job.yaml" \
  --set data.train="$WORK/bad.jsonl"
grep -q "bad.jsonl:2: not valid JSON" "$WORK/out.txt" "$WORK/run-bad"/*.log ||
  { cat "$WORK/out.txt"; fail "the bad row is not named by file:line"; }
log "PASS"
