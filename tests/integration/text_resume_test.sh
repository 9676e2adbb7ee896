#!/usr/bin/env bash
# Exact resume with text data: GRPO on a shuffled JSONL (12 rows, 2 prompts
# per step, so steps 7-8 start the second epoch) with a tiny Qwen3-layout
# model, the real Qwen3 tokenizer and a RewardService process that records
# which rows every step scores (tests/integration/reward_server.py), through
# `tandemctl run --local` on 2 workers with a checkpoint at step 4:
#  - uninterrupted: each epoch is a permutation of the rows; the
#    checkpoint's data cursor says where step 4 left the order;
#  - resumed from that checkpoint in a new run (--resume-from): steps 5-8
#    score the same rows, with the same step metrics, and end with the same
#    model, bit for bit;
#  - the same on 1 worker: the same rows (order independent of world size);
#  - a worker SIGKILLed after step 5: restarted, restored from step 4, the
#    same rows, metrics and final model;
#  - SFT on the same rows resumed from its checkpoint of step 4: the same
#    losses and final model.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/text_lib.sh"
make_qwen3_model "$WORK/base"
make_word_problems "$WORK" train 12

start_reward_server

cat >"$WORK/job.yaml" <<YAML
name: text-resume
kind: grpo
seed: 4
model: {from: $WORK/base}
data: {train: $WORK/train.jsonl, prompt_key: question, chat: true, answer_key: answer, shuffle: true}
task: {reward_service: "127.0.0.1:$PORT", reward_timeout_ms: 20000}
train: {steps: 8, lr: 1.0e-3, global_batch: 4, micro_batch: 2}
rl: {group_size: 2, prompts_per_step: 2, max_new_tokens: 6, kl_coef: 0}
cluster: {workers: 2}
checkpoint: {every: 4, keep: 3}
YAML
ARGS=(--workers 2)
# Runs are sequential: the requests the server recorded during a run are
# that run's (every local run's job is j-000001, so the id cannot tell).
: >"$WORK/requests.jsonl"
RECORDED=0
take_requests() {
  tail -n +$((RECORDED + 1)) "$WORK/requests.jsonl" >"$1/requests.jsonl"
  RECORDED=$(wc -l <"$WORK/requests.jsonl")
  [[ -s "$1/requests.jsonl" ]] || fail "$1: the reward server recorded nothing"
}

# The job id of a run (from its summary) and its final model's digest.
json_get() { /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }
model_sha() { sha256sum "$1/final/model.safetensors" | cut -d' ' -f1; }
# compare RUN FIRST_STEP [rows]: steps FIRST_STEP..8 of RUN scored the same
# rows and (unless "rows") reported the same step metrics as the reference
# run (the last report of a step that ran twice counts).
compare() {
  /usr/bin/python3 - "$WORK/ref" "$1" "$2" "${3:-}" <<'PY'
import json, sys
ref, run, first, rows_only = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "rows"
def rows(run):
    out = {}
    for line in open(f"{run}/requests.jsonl"):
        r = json.loads(line)
        out.setdefault(r["step"], set()).update(int(it["fields"]["id"]) for it in r["items"])
    return out
def metrics(run):
    out = {}
    for line in open(f"{run}/metrics.jsonl"):
        m = json.loads(line)
        keep = {k: m.get(k) for k in ("loss", "reward_mean", "kl", "grad_norm")}
        keep.update({k: v for k, v in m.get("extra", {}).items()
                     if k in ("response_length_mean", "response_length_max", "clip_fraction", "truncated_fraction")})
        out[int(m["step"])] = keep
    return out
a, b = rows(ref), rows(run)
ma, mb = metrics(ref), metrics(run)
for s in range(first, 9):
    assert a.get(s) == b.get(s), f"step {s}: rows {sorted(b.get(s, []))}, uninterrupted {sorted(a.get(s, []))}"
    assert rows_only or ma.get(s) == mb.get(s), f"step {s}: metrics {mb.get(s)}, uninterrupted {ma.get(s)}"
print(f"steps {first}-8: same rows" + ("" if rows_only else " and metrics"))
PY
}

RUN="$WORK/ref"
expect_exit 0 timeout 300 "$TANDEMCTL" run --local --run-dir "$RUN" "${ARGS[@]}" "$WORK/job.yaml"
REF=$(model_sha "$RUN")
take_requests "$RUN"
CKPT=$(ls -d "$RUN"/checkpoints/*4 2>/dev/null | head -n 1)
[[ -n "$CKPT" && -f "$CKPT/manifest.json" ]] || { ls -R "$RUN/checkpoints" >&2 || true; fail "no checkpoint of step 4"; }
[[ "$(json_get "$CKPT/manifest.json" 'd["data_cursor"]')" == "step=4 epoch=0 position=8 rows=12" ]] ||
  fail "data cursor of step 4: $(json_get "$CKPT/manifest.json" 'd["data_cursor"]')"
/usr/bin/python3 - "$RUN/requests.jsonl" <<'PY' || fail "the uninterrupted run's order is not a permutation per epoch"
import json, sys
steps = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    steps.setdefault(r["step"], []).extend(int(it["fields"]["id"]) for it in r["items"])
assert sorted(steps) == list(range(1, 9)), sorted(steps)
order = [sorted(set(steps[s])) for s in range(1, 9)]
assert all(len(o) == 2 for o in order), order
epoch0 = [i for o in order[:6] for i in o]
assert sorted(epoch0) == list(range(12)), epoch0
assert epoch0 != list(range(12)), "shuffle: true kept the file's order"
print("rows per step:", order)
PY
log "reference run: model $REF, rows per epoch a permutation"

# A new run resumed from the reference's checkpoint of step 4.
RUN="$WORK/resumed"
expect_exit 0 timeout 300 "$TANDEMCTL" run --local --run-dir "$RUN" "${ARGS[@]}" --resume-from "$CKPT" "$WORK/job.yaml"
take_requests "$RUN"
grep -q "resumed from step 4 (disk), continuing at step 5" "$RUN/events.jsonl" ||
  { event_lines <"$RUN/events.jsonl" | tail -n 20 >&2; fail "resume: no restore of step 4"; }
compare "$RUN" 5 || fail "resume: the order or the metrics differ"
[[ "$(model_sha "$RUN")" == "$REF" ]] || fail "resume: final model differs from the uninterrupted run"
log "resumed from step 4: same rows, metrics and model"

# The order does not depend on the world size: the same checkpoint resumed
# on one worker scores the same rows (the numbers differ in fp32 rounding).
RUN="$WORK/resumed-1"
expect_exit 0 timeout 300 "$TANDEMCTL" run --local --run-dir "$RUN" --workers 1 --set cluster.workers=1 \
  --resume-from "$CKPT" "$WORK/job.yaml"
take_requests "$RUN"
compare "$RUN" 5 rows || fail "resume on 1 worker: the order differs"
log "resumed from step 4 on 1 worker: same rows"

# A worker killed after step 5 (the checkpoint of step 4 is the newest).
last_step() { tail -n 1 "$1/metrics.jsonl" 2>/dev/null | sed -n 's/.*"step":\([0-9]*\).*/\1/p'; }
step_at_least() { local s; s=$(last_step "$1"); [[ -n "$s" ]] && ((s >= $2)); }
RUN="$WORK/killed"
timeout 300 "$TANDEMCTL" run --local --run-dir "$RUN" "${ARGS[@]}" "$WORK/job.yaml" >"$WORK/killed.out" 2>&1 &
CTL=$!
# The victim is found early: scanning /proc is slow on a loaded machine,
# and the kill must land before the checkpoint of step 8.
wait_until 200 step_at_least "$RUN" 1 || { kill -KILL $CTL; fail "killed: no step 1 within 200 s"; }
VICTIM=$(worker_pid local-1 "$RUN") || { kill -KILL $CTL; fail "killed: local-1 not found"; }
wait_until 200 step_at_least "$RUN" 5 || { kill -KILL $CTL; fail "killed: no step 5 within 200 s"; }
kill -KILL "$VICTIM"
log "SIGKILL local-1 (pid $VICTIM) at step $(last_step "$RUN")"
RC=0
wait $CTL || RC=$?
((RC == 0)) || { cat "$WORK/killed.out" >&2; fail "killed: run exited $RC"; }
take_requests "$RUN"
grep -q "restoring step 4 from" "$RUN/events.jsonl" ||
  { event_lines <"$RUN/events.jsonl" | tail -n 20 >&2; fail "killed: recovery did not restore step 4"; }
compare "$RUN" 1 || fail "killed: the order or the metrics differ"
[[ "$(model_sha "$RUN")" == "$REF" ]] || fail "killed: final model differs from the uninterrupted run"
log "killed and recovered: same rows, metrics and model"

# SFT on the same rows (4 per step: epochs of 3 steps, so the checkpoint
# of step 4 lies inside the second epoch and step 7 starts the third):
# resumed from step 4, the same losses at steps 5-8 and the same model.
cat >"$WORK/sft.yaml" <<YAML
name: text-resume-sft
kind: sft
seed: 4
model: {from: $WORK/base}
data: {train: $WORK/train.jsonl, prompt_key: question, chat: true, response_key: answer, shuffle: true}
train: {steps: 8, lr: 1.0e-3, global_batch: 4, micro_batch: 2}
cluster: {workers: 2}
checkpoint: {every: 4, keep: 3}
YAML
expect_exit 0 timeout 300 "$TANDEMCTL" run --local --run-dir "$WORK/sft-ref" "${ARGS[@]}" "$WORK/sft.yaml"
SFT_CKPT=$(ls -d "$WORK"/sft-ref/checkpoints/*4 2>/dev/null | head -n 1)
[[ -n "$SFT_CKPT" ]] || fail "sft: no checkpoint of step 4"
[[ "$(json_get "$SFT_CKPT/manifest.json" 'd["data_cursor"]')" == "step=4 epoch=1 position=4 rows=12" ]] ||
  fail "sft: data cursor of step 4: $(json_get "$SFT_CKPT/manifest.json" 'd["data_cursor"]')"
expect_exit 0 timeout 300 "$TANDEMCTL" run --local --run-dir "$WORK/sft-resumed" "${ARGS[@]}" --resume-from "$SFT_CKPT" "$WORK/sft.yaml"
/usr/bin/python3 - "$WORK/sft-ref/metrics.jsonl" "$WORK/sft-resumed/metrics.jsonl" <<'PY' || fail "sft: resumed losses differ"
import json, sys
a, b = ({int(m["step"]): m["loss"] for m in map(json.loads, open(p))} for p in sys.argv[1:3])
assert sorted(b) == [5, 6, 7, 8], sorted(b)
assert all(a[s] == b[s] for s in b), (a, b)
assert len({a[s] for s in a}) == 8, a  # every step its own batch
PY
[[ "$(model_sha "$WORK/sft-resumed")" == "$(model_sha "$WORK/sft-ref")" ]] || fail "sft: resumed final model differs"
log "PASS"
