#!/usr/bin/env bash
# Coordinator SIGKILL + restart on the same state dir: jobs and workers
# reappear (workers reconnect with backoff and the same identity), and a job
# that was PENDING still runs to SUCCEEDED once enough workers are there.
source "$(dirname "$0")/lib.sh"
JOB="$TI_DIR/jobs/sft-tiny.yaml"
start_coordinator --lease-ms 3000 --heartbeat-ms 300
start_worker r0
wait_until 30 workers_idle_at_least 1 || fail "worker did not register"
DONE=$(ctl submit "$JOB" --set name=before-restart)
expect_exit 0 timeout 240 "$TANDEMCTL" --coordinator "$GRPC_ADDR" --token-file "$WORK/admin.token" watch "$DONE"
PENDING=$(ctl submit "$JOB" --workers 2 --set name=pending-across-restart)
wait_until 10 job_in_state "$PENDING" PENDING || fail "job not PENDING"
WID=$(ctl workers --output json | sed -n 's/.*"id":"\([^"]*\)".*"name":"r0".*/\1/p' | head -1)

log "SIGKILL coordinator $COORD_PID"
stop_member KILL coordinator
OLD_GRPC=$GRPC_ADDR
# Same state dir, same port (the worker's address must stay valid): the
# launcher starts it again on the port it had.
start_coordinator --lease-ms 3000 --heartbeat-ms 300
[[ "$GRPC_ADDR" == "$OLD_GRPC" ]] || fail "restarted on $GRPC_ADDR, not $OLD_GRPC"
healthy
expect_exit 0 ctl jobs
expect_output "before-restart"
expect_output "pending-across-restart"
[[ "$(job_state "$DONE")" == SUCCEEDED ]] || fail "finished job lost its state"
[[ "$(job_state "$PENDING")" == PENDING ]] || fail "pending job is $(job_state "$PENDING")"
wait_until 30 workers_idle_at_least 1 || fail "worker did not come back"
WID2=$(ctl workers --output json | sed -n 's/.*"id":"\([^"]*\)".*"name":"r0".*/\1/p' | head -1)
[[ "$WID" == "$WID2" ]] || fail "worker id changed across the restart: $WID -> $WID2"
start_worker r1
expect_exit 0 timeout 240 "$TANDEMCTL" --coordinator "$GRPC_ADDR" --token-file "$WORK/admin.token" watch "$PENDING"
healthy
log "PASS"
