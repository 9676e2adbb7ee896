#!/usr/bin/env bash
# tandemctl run --local --nodes K: the local workers declare K emulated
# nodes (node by node), so a stage-3 job with zero.hierarchical_partition
# runs on one machine and its steps report inter-node bytes; with the
# default (one node) they report none. Bad --nodes values are refused with
# exit 2 and a message naming the flag.
source "$(dirname "$0")/lib.sh"
JOB="$TI_DIR/jobs/sft-tiny.yaml"

# inter_node_bytes RUN_DIR: the job's inter-node bytes summed over its steps.
inter_node_bytes() {
  /usr/bin/python3 - "$1/metrics.jsonl" <<'PY'
import json, sys
total = 0.0
for line in open(sys.argv[1]):
    if line.strip():
        total += float((json.loads(line).get("extra") or {}).get("job_tier_sent_inter_node", 0))
print(int(total))
PY
}

log "--- 2 workers on 2 nodes, hpZ"
RUN="$WORK/hpz"
expect_exit 0 timeout 200 "$TANDEMCTL" run --local --workers 2 --nodes 2 --run-dir "$RUN" "$JOB" \
  --set cluster.zero_stage=3 --set zero.hierarchical_partition=true
expect_output "SUCCEEDED"
grep -qE "node: \"?local-node0\"?$" "$RUN/worker-0.log" || fail "worker 0 did not declare node local-node0"
grep -qE "node: \"?local-node1\"?$" "$RUN/worker-1.log" || fail "worker 1 did not declare node local-node1"
bytes=$(inter_node_bytes "$RUN")
((bytes > 0)) || fail "hpZ on 2 nodes reported no inter-node bytes"
log "inter-node bytes over the job: $bytes"

log "--- 2 workers on one node (default)"
RUN="$WORK/one-node"
expect_exit 0 timeout 200 "$TANDEMCTL" run --local --workers 2 --run-dir "$RUN" "$JOB" --set cluster.zero_stage=3
expect_output "SUCCEEDED"
bytes=$(inter_node_bytes "$RUN")
((bytes == 0)) || fail "one node reported $bytes inter-node bytes"

log "--- bad --nodes"
expect_exit 2 "$TANDEMCTL" run --local --workers 2 --nodes 3 "$JOB"
expect_output "--nodes: 3 is out of range \[1, 2\]"
expect_exit 2 "$TANDEMCTL" run --local --workers 2 --nodes 0 "$JOB"
expect_output "--nodes: 0 is out of range"
expect_exit 2 "$TANDEMCTL" run --local --nodes two "$JOB"
expect_output "--nodes: expected an integer, got 'two'"
log "PASS"
