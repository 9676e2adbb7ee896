#!/usr/bin/env bash
# A worker killed (SIGKILL) during a job: its lease expires, the job reports
# it (RECOVERING, then FAILED with the reason once no replacement comes), and
# `tandemctl workers` shows it LOST. Then SIGTERM of a busy
# worker: it stops within its bound.
source "$(dirname "$0")/lib.sh"
JOB="$TI_DIR/jobs/sft-tiny.yaml"
start_coordinator --lease-ms 2000 --heartbeat-ms 250 --set reattach_grace_ms=1000 \
  --set replacement_timeout_ms=1000
start_worker a
start_worker b
wait_until 30 workers_idle_at_least 2 || fail "workers did not register"
ID=$(ctl submit "$JOB" --workers 2 --set train.steps=100000 --set name=lose-a-worker)
wait_until 60 job_in_state "$ID" RUNNING || fail "job did not start"
# Past SETUP: a few steps done, so the loss hits a training step.
job_step_at_least() { (($(ctl status "$1" --output json | sed -n 's/.*"step":"\{0,1\}\([0-9]*\).*/\1/p' | head -1) >= $2)); }
wait_until 60 job_step_at_least "$ID" 2 || fail "job made no progress"
kill_member KILL b
# RECOVERING first (no spare worker), then FAILED after the replacement timeout.
wait_until 30 job_in_state "$ID" FAILED || fail "job is $(job_state "$ID") after the worker died"
expect_exit 0 ctl status "$ID"
# The reason names the lost worker's lease, or the collective its peer saw break first.
expect_output "FAILED"
expect_output "lost\|lease\|reset\|closed"
lost_at_least_one() { (($(workers_in_state LOST) >= 1)); }
wait_until 10 lost_at_least_one \
  || { ctl workers; fail "no LOST worker"; }
expect_exit 0 ctl workers
expect_output "LOST"
healthy

# SIGTERM to the remaining worker while idle or busy: it exits within its
# bound (a SETUP in progress is aborted at once; any other phase gets 20 s
# of grace, then the abort ends it promptly). The 45 s exit watchdog must
# never be what ends it.
TERM_AT=$(date +%s.%N)
stop_member TERM a 25
log "survivor exited $(awk -v a="$TERM_AT" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }') s after SIGTERM"
healthy
log "PASS"
