#!/usr/bin/env bash
# GRPO on a hybrid model through real processes (tandemctl run --local, 2
# workers): configs/grpo-arith-hybrid.yaml (layers [linear, full, linear]),
# shortened, succeeds; every rollout step reports its tokens and the
# linear layers' states (rollout_state_bytes, inside kv_cache_bytes); the
# end-of-run eval generates with the same engine. rollout.tp_size 2 is
# refused at SETUP, naming the linear layer and the key.
source "$(dirname "$0")/lib.sh"
JOB="$TI_DIR/../../configs/grpo-arith-hybrid.yaml"
SETS=(--set init.sft.steps=10 --set init.sft.stop_accuracy=0 --set train.steps=3 --set train.eval_every=0
  --set cluster.threads_per_worker=1)

expect_exit 0 timeout 240 "$TANDEMCTL" run --local --run-dir "$WORK/run" "$JOB" "${SETS[@]}"
expect_output "SUCCEEDED"
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

expect_exit 1 timeout 120 "$TANDEMCTL" run --local --run-dir "$WORK/tp2" "$JOB" "${SETS[@]}" --set rollout.tp_size=2
expect_output "FAILED"
expect_output "layer 0 is a linear-attention layer"
expect_output "rollout.tp_size 1"
log "PASS"
