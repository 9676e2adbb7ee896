#!/usr/bin/env bash
# The device code path through real daemons: two `--device cpu-guarded`
# workers (every buffer in guarded memory, any host access to it faults) run
# an SFT job at ZeRO stage 3 to completion; two plain cpu workers then run
# the same job; the exported weights are bit-identical. `tandemctl run
# --local --worker-device cpu-guarded` gives the same weights too.
source "$(dirname "$0")/lib.sh"
require_program python3 python3  # compare_safetensors.py
JOB="$TI_DIR/jobs/sft-tiny.yaml"

start_coordinator
start_worker g0 --device cpu-guarded
start_worker g1 --device cpu-guarded
wait_until 30 workers_idle_at_least 2 || fail "guarded workers did not register"

run_job() {  # run_job NAME DEVICE: the job on the 2 idle workers, exported to $WORK/NAME
  local id
  id=$(ctl submit "$JOB" --workers 2 --set "name=$1" --set cluster.zero_stage=3 --set "output_dir=$WORK/$1")
  [[ -n "$id" ]] || fail "submit printed no job id"
  expect_exit 0 timeout 120 "$TANDEMCTL" --coordinator "$GRPC_ADDR" --token-file "$WORK/admin.token" watch "$id"
  expect_output "SUCCEEDED"
  expect_exit 0 ctl logs "$id"
  expect_output "ZeRO stage 3, device $2"
}

log "--- guarded workers"
run_job guarded cpu-guarded
signal_and_wait TERM g0 g1

log "--- cpu workers"
start_worker c0
start_worker c1
wait_until 30 workers_idle_at_least 2 || fail "cpu workers did not register"
run_job cpu cpu
python3 "$TI_DIR/compare_safetensors.py" "$WORK/guarded/model.safetensors" "$WORK/cpu/model.safetensors" ||
  fail "guarded and cpu runs exported different weights"
healthy

log "--- tandemctl run --local --worker-device cpu-guarded"
expect_exit 0 timeout 120 "$TANDEMCTL" run --local --workers 2 --worker-device cpu-guarded "$JOB" \
  --set cluster.zero_stage=3 --run-dir "$WORK/local-guarded"
grep -q "device cpu-guarded" "$WORK"/local-guarded/worker-0.log || fail "local workers did not run cpu-guarded"
python3 "$TI_DIR/compare_safetensors.py" "$WORK/local-guarded/final/model.safetensors" "$WORK/cpu/model.safetensors" ||
  fail "run --local on cpu-guarded exported different weights"
expect_exit 2 "$TANDEMCTL" run --local --worker-device cuda "$JOB"
expect_output "expected cpu-guarded"
log "PASS"
