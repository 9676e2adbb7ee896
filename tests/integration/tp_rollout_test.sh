#!/usr/bin/env bash
# Tensor-parallel rollouts through real processes: tandemctl run --local with
# 2 workers (ZeRO-3) and rollout.tp_size 2 succeeds, reports the switch
# bytes (fewer than a full gather) and the hidden all-reduce share, and its
# per-step rollout tokens, rewards and losses equal the same job's with
# tp_size 1. So does tp_size 2 with Shift Parallelism (rollout.shift_parallel,
# a threshold that sends the large engine steps sequence-parallel and the
# small ones tensor-parallel), which must report both kinds of step.
source "$(dirname "$0")/lib.sh"
JOB="$TI_DIR/../../configs/grpo-arith-tiny.yaml"
SETS=(--set init.sft.steps=10 --set init.sft.stop_accuracy=0 --set train.steps=3 --set train.eval_every=0
  --set cluster.zero_stage=3 --set cluster.threads_per_worker=1)

# step rollout_tokens reward loss per line, then the TP figures when present.
figures() {
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    o = json.loads(line)
    e = o.get("extra", {})
    if "rollout_tokens" in e:
        print(o["step"], e["rollout_tokens"], o.get("reward_mean"), o.get("loss"))
PY
}
shift_figures() {
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line).get("extra", {})
    if "rollout_tp_size" in e:
        ok = e.get("rollout_sp_steps", 0) > 0 and e.get("rollout_tp_steps", 0) > 0 \
            and e.get("rollout_shift_full_copy_bytes", 0) > 0
        print("ok" if ok else "bad " + json.dumps(e))
PY
}
tp_figures() {
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line).get("extra", {})
    if "rollout_tp_size" in e:
        ok = e["rollout_tp_size"] == 2 and 0 < e["rollout_switch_bytes"] < e["rollout_switch_full_gather_bytes"] \
            and 0 <= e["rollout_tp_hidden_share"] <= 1
        print("ok" if ok else "bad " + json.dumps(e))
PY
}

for tp in 1 2; do
  expect_exit 0 timeout 200 "$TANDEMCTL" run --local --workers 2 --run-dir "$WORK/tp$tp" "$JOB" "${SETS[@]}" \
    --set rollout.tp_size=$tp
  expect_output "SUCCEEDED"
  figures "$WORK/tp$tp/metrics.jsonl" >"$WORK/figures-$tp.txt"
done
[[ $(wc -l <"$WORK/figures-1.txt") == 3 ]] || fail "tp_size 1: $(cat "$WORK/figures-1.txt")"
diff "$WORK/figures-1.txt" "$WORK/figures-2.txt" || fail "tp_size 2 rollouts differ from tp_size 1"
checks=$(tp_figures "$WORK/tp2/metrics.jsonl")
[[ "$checks" == $'ok\nok\nok' ]] || fail "tp_size 2 metrics: $checks"
[[ -z "$(tp_figures "$WORK/tp1/metrics.jsonl")" ]] || fail "tp_size 1 reports TP metrics"

# Shift Parallelism: the first steps of a rollout (32 prompts prefilled, then
# up to 256 sequences decoding) reach the threshold, the tail steps do not.
expect_exit 0 timeout 200 "$TANDEMCTL" run --local --workers 2 --run-dir "$WORK/shift" "$JOB" "${SETS[@]}" \
  --set rollout.tp_size=2 --set rollout.shift_parallel=true --set rollout.shift_threshold_tokens=200
expect_output "SUCCEEDED"
figures "$WORK/shift/metrics.jsonl" >"$WORK/figures-shift.txt"
diff "$WORK/figures-1.txt" "$WORK/figures-shift.txt" || fail "shift-parallel rollouts differ from tp_size 1"
checks=$(shift_figures "$WORK/shift/metrics.jsonl")
[[ "$checks" == $'ok\nok\nok' ]] || fail "shift-parallel metrics: $checks"

# A tp_size that does not divide the workers is refused before anything runs.
expect_exit 2 timeout 60 "$TANDEMCTL" run --local --workers 2 --run-dir "$WORK/bad" "$JOB" "${SETS[@]}" \
  --set rollout.tp_size=3
expect_output "rollout.tp_size"
log "tensor-parallel and shift-parallel rollouts equal tp_size 1"
