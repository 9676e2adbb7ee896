#!/usr/bin/env bash
# Tensor-parallel rollout workers in disaggregated placement through real
# processes: tandemctl run --local with 3 workers (2 rollout workers as one
# TP group, 1 trainer, sync coupling) and rollout.tp_size 2 succeeds, its
# weight syncs move fewer bytes than a full copy per rollout worker, and its
# per-step rollout tokens, rewards and losses equal the same job's with
# tp_size 1; with async coupling (max_staleness 1) it runs within its
# bound. A tp_size that does not divide the rollout workers is refused
# before anything runs.
source "$(dirname "$0")/lib.sh"
JOB="$TI_DIR/../../configs/grpo-arith-tiny.yaml"
SETS=(--set init.sft.steps=10 --set init.sft.stop_accuracy=0 --set train.steps=3 --set train.eval_every=0
  --set cluster.workers=3 --set cluster.threads_per_worker=1 --set placement.mode=disaggregated
  --set placement.rollout_workers=2 --set placement.train_workers=1 --set placement.coupling=sync)

# step rollout_tokens reward loss per line.
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
# One line per step with the weight sync figures: ok when the rollout
# workers received less than a full copy each.
sync_figures() {
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line).get("extra", {})
    if "weight_sync_bytes" in e:
        ok = e.get("rollout_tp_size") == 2 and 0 < e["weight_sync_bytes"] < e["weight_sync_full_bytes"]
        print("ok" if ok else "bad " + json.dumps(e))
PY
}

for tp in 1 2; do
  expect_exit 0 timeout 300 "$TANDEMCTL" run --local --workers 3 --run-dir "$WORK/tp$tp" "$JOB" "${SETS[@]}" \
    --set rollout.tp_size=$tp
  expect_output "SUCCEEDED"
  figures "$WORK/tp$tp/metrics.jsonl" >"$WORK/figures-$tp.txt"
done
[[ $(wc -l <"$WORK/figures-1.txt") == 3 ]] || fail "tp_size 1: $(cat "$WORK/figures-1.txt")"
diff "$WORK/figures-1.txt" "$WORK/figures-2.txt" || fail "tp_size 2 rollouts differ from tp_size 1"
checks=$(sync_figures "$WORK/tp2/metrics.jsonl")
[[ "$checks" == $'ok\nok\nok' ]] || fail "tp_size 2 weight sync metrics: $checks"

# Refused at submit: 2 does not divide 1 rollout worker.
expect_exit 2 timeout 60 "$TANDEMCTL" run --local --workers 3 --run-dir "$WORK/bad" "$JOB" "${SETS[@]}" \
  --set rollout.tp_size=2 --set placement.rollout_workers=1 --set placement.train_workers=2
expect_output "does not divide the placement.rollout_workers = 1"

# Async coupling (K = 1) with TP runs to the end within its bound.
expect_exit 0 timeout 300 "$TANDEMCTL" run --local --workers 3 --run-dir "$WORK/async" "$JOB" "${SETS[@]}" \
  --set rollout.tp_size=2 --set placement.coupling=async --set placement.max_staleness=1
expect_output "SUCCEEDED"
stale=$(/usr/bin/python3 - "$WORK/async/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l).get("extra", {}) for l in open(sys.argv[1])]
rows = [e for e in rows if "staleness_max" in e]
print("ok" if len(rows) == 3 and all(e["staleness_max"] <= 1 for e in rows) else "bad %s" % rows)
PY
)
[[ "$stale" == ok ]] || fail "async tp_size 2: $stale"
log "tensor-parallel rollout workers equal tp_size 1 in disaggregated placement"
