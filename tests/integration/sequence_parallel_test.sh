#!/usr/bin/env bash
# Sequence parallelism end to end (tandemctl run --local, 2 worker processes):
# the tiny SFT job with cluster.sequence_parallel 2 (one group of 2 ranks),
# at its own ZeRO stage and at stage 3, gives the same loss at every step as
# with 1 (2 data-parallel ranks), within a relative difference of 1e-4, and a
# shortened run of the
# long-context example (configs/sft-long-context.yaml: hybrid layers,
# sequence_parallel 2) succeeds and reports its all-scan and all-gather bytes.
source "$(dirname "$0")/lib.sh"
JOB="$TI_DIR/jobs/sft-tiny.yaml"
LONG="$TI_DIR/../../configs/sft-long-context.yaml"

for sp in 1 2; do
  expect_exit 0 timeout 300 "$TANDEMCTL" run --local --workers 2 --run-dir "$WORK/sp$sp" "$JOB" \
    --set cluster.sequence_parallel=$sp
  expect_output "SUCCEEDED"
done
expect_exit 0 timeout 300 "$TANDEMCTL" run --local --workers 2 --run-dir "$WORK/sp2z3" "$JOB" \
  --set cluster.sequence_parallel=2 --set cluster.zero_stage=3
expect_output "SUCCEEDED"
grep -q '"sp_bytes_sent_allgather"' "$WORK/sp2z3/metrics.jsonl" || fail "stage 3 run reports no sp_bytes_sent_allgather"
for run in sp2 sp2z3; do
/usr/bin/python3 - "$WORK/sp1/metrics.jsonl" "$WORK/$run/metrics.jsonl" "$run" <<'PY' || fail "$run: losses differ"
import json, sys
def losses(path):
    out = {}
    for line in open(path):
        m = json.loads(line)
        if "step" in m and "loss" in m:
            out[int(m["step"])] = float(m["loss"])
    return out
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert a and sorted(a) == sorted(b), (a, b)
worst = max(abs(a[s] - b[s]) / max(abs(a[s]), 1e-12) for s in a)
print(f"{sys.argv[3]} vs sequence_parallel 1: {len(a)} steps, largest loss rel diff {worst:.2e}", file=sys.stderr)
sys.exit(0 if worst <= 1e-4 else 1)
PY
done

expect_exit 0 timeout 300 "$TANDEMCTL" run --local --run-dir "$WORK/long" "$LONG" --set train.steps=2
expect_output "SUCCEEDED"
lines=$(grep -c '"step"' "$WORK/long/metrics.jsonl" || true)
((lines == 2)) || fail "long-context run: metrics.jsonl has $lines step lines, want 2"
for kind in allgather all_scan reduce_scatter; do
  grep -q "\"sp_bytes_sent_$kind\"" "$WORK/long/metrics.jsonl" || fail "long-context run reports no sp_bytes_sent_$kind"
done

# A value that does not divide the workers: refused before anything starts.
expect_exit 2 "$TANDEMCTL" run --local --workers 2 --run-dir "$WORK/bad" "$JOB" --set cluster.sequence_parallel=3
expect_output "cluster.sequence_parallel"
log "PASS"
