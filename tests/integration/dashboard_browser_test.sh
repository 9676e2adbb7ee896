#!/usr/bin/env bash
# The web dashboard in a real browser: a coordinator and three CPU workers
# run a tiny GRPO job on two of them; one member is killed (the spare takes
# its place: a recovery); then headless Chromium logs in through the form
# and the test checks the DOM the page's JavaScript drew (worker and job
# rows, points in the loss, reward, accuracy and tokens/s charts, phase
# spans for each member in the timeline, a checkpoint, the recovery) and
# saves a screenshot (dashboard.png) and the DOM to $TANDEM_TEST_OUT
# (ctest: build/tests/integration/dashboard_browser/; else $WORK/out, which
# KEEP_WORK=1 keeps). dashboard_browser.py drives the browser. About 30 s.
source "$(dirname "$0")/lib.sh"
require_program chromium chromium
require_python_module websocket python3-websocket
OUT="${TANDEM_TEST_OUT:-$WORK/out}"
mkdir -p "$OUT"

start_coordinator --lease-ms 2000 --heartbeat-ms 250 --set reattach_grace_ms=1000 --set replacement_timeout_ms=20000
for w in alpha beta gamma; do
  start_worker "$w"
done
wait_until 60 workers_idle_at_least 3 || fail "3 workers did not register"

cat >"$WORK/job.yaml" <<YAML
name: grpo-dashboard
kind: grpo
seed: 3
model:
  config: {vocab_size: 99, hidden_size: 128, intermediate_size: 344, num_hidden_layers: 3, num_attention_heads: 4,
           num_key_value_heads: 2, max_position_embeddings: 64, tokenizer: char}
task: {name: arithmetic, op: add, digits: 1, eval_size: 32, partial_reward: 0.5}
init: {sft: {steps: 30, lr: 3.0e-3}}
train: {steps: 100000, lr: 5.0e-4, global_batch: 128, micro_batch: 16, eval_every: 5}
rl: {group_size: 8, prompts_per_step: 16, max_new_tokens: 4, temperature: 1.0}
cluster: {workers: 2, device: cpu, threads_per_worker: 1}
checkpoint: {every: 5, keep: 2, dir: $WORK/ckpt}
YAML
ID=$(ctl submit "$WORK/job.yaml")
[[ -n "$ID" ]] || fail "submit printed no job id"
follow_job dash "$ID"
wait_until 120 step_at_least dash 8 || fail "the job made no 8 RL steps in 120 s: $(job_events dash | tail -5)"

# Kill one member (its name from the dashboard's JSON, with the bearer
# token): the spare replaces it.
victim=$(curl -sf --max-time 10 -H "Authorization: Bearer $(cat "$WORK/admin.token")" \
  "http://$METRICS_ADDR/dashboard/api/job?id=$ID" |
  /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["job"]["members"][1]["name"])') ||
  fail "cannot read the job's members from /dashboard/api/job"
log "killing member $victim (pid $(member_pid "$victim"))"
kill_member KILL "$victim"
wait_until 90 event_seen dash "recovered in" || fail "no recovery within 90 s: $(job_events dash | tail -8)"
now=$(followed_step dash)
wait_until 60 step_at_least dash $((now + 8)) || fail "no steps after the recovery"

/usr/bin/python3 "$TI_DIR/dashboard_browser.py" "http://$METRICS_ADDR" "$WORK/admin.token" "$OUT" "$ID" --recovery \
  || fail "the dashboard checks failed (screenshot and DOM in $OUT)"
[[ -s "$OUT/dashboard.png" ]] || fail "no screenshot"
log "screenshot: $OUT/dashboard.png"
ctl cancel "$ID" >/dev/null
log "PASS"
