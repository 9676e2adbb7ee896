#!/usr/bin/env bash
# GRPO on a hybrid model through real processes (tandemctl run --local, 2
# workers): configs/grpo-arith-hybrid.yaml (layers [linear, full, linear]),
# shortened, succeeds; every rollout step reports its tokens and the
# linear layers' states (rollout_state_bytes, inside kv_cache_bytes); the
# end-of-run eval generates with the same engine. With rollout.tp_size 2
# (the two workers split the heads, each keeping its heads' states) the
# per-step rollout tokens, rewards and losses equal tp_size 1's.
source "$(dirname "$0")/lib.sh"
JOB="$TI_DIR/../../configs/grpo-arith-hybrid.yaml"
SETS=(--set init.sft.steps=10 --set init.sft.stop_accuracy=0 --set train.steps=3 --set train.eval_every=0
  --set cluster.threads_per_worker=1)

expect_exit 0 timeout 240 "$TANDEMCTL" run --local --run-dir "$WORK/run" "$JOB" "${SETS[@]}"
expect_output "SUCCEEDED"
# step rollout_tokens reward loss per line.
figures() {
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    o = json.loads(line)
    if "rollout_tokens" in o.get("extra", {}):
        print(o["step"], o["extra"]["rollout_tokens"], o.get("reward_mean"), o.get("loss"))
PY
}
/usr/bin/python3 - "$WORK/run/metrics.jsonl" <<'PY' || fail "rollout metrics of the hybrid job"
import json, sys
steps = 0
accuracy = None
for line in open(sys.argv[1]):
    o = json.loads(line)
    e = o.get("extra", {})
    if "accuracy" in o:
        accuracy = o["accuracy"]
    if "rollout_tokens" not in e:
        continue
    steps += 1
    state, kv = e.get("rollout_state_bytes", 0), e.get("kv_cache_bytes", 0)
    assert e["rollout_tokens"] > 0 and 0 < state < kv, e
assert steps == 3, steps
assert accuracy is not None, "no eval accuracy reported"
print(f"{steps} rollout steps with linear-layer states; eval accuracy {accuracy}", file=sys.stderr)
PY

figures "$WORK/run/metrics.jsonl" >"$WORK/figures-1.txt"
expect_exit 0 timeout 240 "$TANDEMCTL" run --local --run-dir "$WORK/tp2" "$JOB" "${SETS[@]}" --set rollout.tp_size=2
expect_output "SUCCEEDED"
figures "$WORK/tp2/metrics.jsonl" >"$WORK/figures-2.txt"
[[ $(wc -l <"$WORK/figures-1.txt") == 3 ]] || fail "tp_size 1: $(cat "$WORK/figures-1.txt")"
diff "$WORK/figures-1.txt" "$WORK/figures-2.txt" || fail "tp_size 2 rollouts of the hybrid model differ from tp_size 1"
/usr/bin/python3 - "$WORK/tp2/metrics.jsonl" <<'PY' || fail "tensor-parallel rollout metrics of the hybrid job"
import json, sys
# A rank keeps half the heads' state for each sequence of its TP group.
tp = [json.loads(l)["extra"] for l in open(sys.argv[1]) if "rollout_tokens" in json.loads(l).get("extra", {})]
assert len(tp) == 3 and all(e["rollout_tp_size"] == 2 and e["rollout_state_bytes"] > 0 for e in tp), tp
PY
log "PASS"
