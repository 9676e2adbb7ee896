#!/usr/bin/env bash
# deploy/slurm/tandem.sbatch on a real one-machine Slurm cluster (Debian's
# slurmctld, slurmd and munge; tests/deploy/slurm_cluster.sh):
#  1. sbatch runs the tiny SFT job with 2 CPU workers to completion; the
#     batch job exits 0 and the exported model is in the run directory.
#  2. Preemption: `scancel --signal=TERM` on the worker step of a longer job
#     stops the workers; the script requeues the batch job, and the requeued
#     run resumes the same Tandem job from its newest checkpoint and finishes.
#  3. The same with SIGTERM to every step (the coordinator's too), as a
#     preemption or `--signal=TERM@N` before the time limit sends it.
# Needs root (slurmd starts job steps as the submitting user): the test fails
# and says so otherwise. Binaries: TANDEMCTL, TANDEM_COORDINATOR_BIN and
# TANDEM_WORKER_BIN (tests/deploy/CMakeLists.txt), all in one directory.
set -euo pipefail
: "${TANDEMCTL:?}" "${TANDEM_COORDINATOR_BIN:?}" "${TANDEM_WORKER_BIN:?}"
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
source "$ROOT/tests/support/require.sh"
for p in munged:munge slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client scontrol:slurm-client \
  squeue:slurm-client scancel:slurm-client sinfo:slurm-client; do
  require_program "${p%%:*}" "${p##*:}"
done
require_program /usr/bin/python3 python3
BIN="$(dirname "$TANDEMCTL")"
[[ -x "$BIN/tandem-coordinator" && -x "$BIN/tandem-worker" ]] ||
  { echo "FAIL: tandem-coordinator and tandem-worker must sit next to $TANDEMCTL" >&2; exit 1; }
JOB="$ROOT/tests/integration/jobs/sft-tiny.yaml"
SBATCH="$ROOT/deploy/slurm/tandem.sbatch"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/tandem-slurm.XXXXXX")"
chmod 755 "$WORK"

log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
fail() {
  log "FAIL: $*"
  local f
  for f in "$WORK"/slurm-*.out "$WORK"/runs/*/coordinator.log "$WORK"/runs/*/workers.log; do
    [[ -f "$f" ]] || continue
    echo "--- $f (tail)" >&2
    tail -n 30 "$f" >&2
  done
  exit 1
}
source "$HERE/slurm_cluster.sh"
cleanup() {
  local rc=$?
  set +e
  slurm_cluster_stop
  if [[ $rc -eq 0 && -z "${KEEP_WORK:-}" ]]; then rm -rf "$WORK"; else log "kept $WORK"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

slurm_cluster_start "$WORK/slurm" 3
read -r GRPC_PORT METRICS_PORT < <(free_ports 2)
export TANDEM_BIN="$BIN" TANDEM_RUN_ROOT="$WORK/runs" TANDEM_PORT="$GRPC_PORT" \
  TANDEM_METRICS_PORT="$METRICS_PORT" TANDEM_LISTEN_HOST=127.0.0.1

# submit NAME ARGS...: sbatch with 2 CPU tasks; prints the Slurm job id.
submit() {
  local name=$1
  shift
  sbatch --parsable --job-name="$name" --ntasks=2 --cpus-per-task=1 --time=10 \
    --output="$WORK/slurm-%j.out" "$SBATCH" "$JOB" --set "name=$name" "$@"
}
slurm_field() { scontrol show job "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }
slurm_state() { slurm_field "$1" JobState; }
# wait_state JOB SECONDS STATE...: until the job is in one of STATEs.
wait_state() {
  local job=$1 secs=$2 s=""
  shift 2
  local deadline=$((SECONDS + secs))
  while ((SECONDS < deadline)); do
    s=$(slurm_state "$job")
    for want in "$@"; do [[ "$s" == "$want" ]] && return 0; done
    case $s in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY)
      fail "slurm job $job ended $s (exit $(slurm_field "$job" ExitCode)), expected $*" ;;
    esac
    sleep 1
  done
  fail "slurm job $job still $s after $secs s, expected $*"
}
check_model() {
  local dir=$1
  [[ -f "$dir/config.json" ]] || fail "no config.json in the exported model $dir"
  ls "$dir"/*.safetensors >/dev/null 2>&1 || fail "no safetensors in $dir"
}
ctl() {
  "$TANDEMCTL" --coordinator "127.0.0.1:$GRPC_PORT" --token-file "$WORK/runs/slurm-$1/admin.token" "${@:2}"
}

log "--- 1. tiny SFT job, 2 workers"
J1=$(submit sft-slurm)
wait_state "$J1" 120 COMPLETED
[[ $(slurm_field "$J1" ExitCode) == 0:0 ]] || fail "slurm job $J1 exit $(slurm_field "$J1" ExitCode)"
check_model "$WORK/runs/slurm-$J1/final"
grep -q "SUCCEEDED" "$WORK/slurm-$J1.out" || fail "the batch output does not show the job SUCCEEDED"
log "job $J1 COMPLETED; model in $WORK/runs/slurm-$J1/final"

# preempt_and_resume NAME WHAT: runs a 400-step job, sends SIGTERM (scancel
# --signal=TERM) to WHAT (workers: the worker step; all: every step, as a
# preemption or --signal=TERM@N does) once it has a checkpoint, and checks
# that the script requeues the batch job, which resumes the same Tandem job
# from a checkpoint and finishes.
preempt_and_resume() {
  local name=$1 what=$2 steps=400 step=0 job tjob="" target deadline
  job=$(submit "$name" --set train.steps=$steps --set checkpoint.every=25)
  wait_state "$job" 60 RUNNING
  deadline=$((SECONDS + 90))
  while ((SECONDS < deadline)); do
    if [[ -s "$WORK/runs/slurm-$job/job.id" ]]; then
      tjob=$(cat "$WORK/runs/slurm-$job/job.id")
      step=$(ctl "$job" status "$tjob" --output json 2>/dev/null | sed -n 's/.*"step":"\{0,1\}\([0-9]*\).*/\1/p' | head -1)
      ((${step:-0} >= 30)) && break
    fi
    sleep 0.5
  done
  ((${step:-0} >= 30)) || fail "tandem job of slurm job $job did not reach step 30 in 90 s (step ${step:-none})"
  ((step < steps - 50)) || fail "the job ran too fast to preempt (step $step of $steps)"
  if [[ $what == workers ]]; then
    target=$(squeue -h -s -j "$job" -o "%i %j" | awk '$2 == "tandem-workers" { print $1 }')
    [[ -n "$target" ]] || fail "no tandem-workers step in job $job: $(squeue -s -j "$job" 2>&1)"
  else
    target=$job
  fi
  log "tandem job $tjob at step $step; scancel --signal=TERM $target"
  scancel --signal=TERM "$target"
  # The script requeues the batch job: it goes back to PENDING with one restart.
  deadline=$((SECONDS + 90))
  while ((SECONDS < deadline)); do
    [[ $(slurm_field "$job" Restarts) == 1 ]] && break
    case $(slurm_state "$job") in COMPLETED | FAILED) fail "job $job ended instead of requeueing" ;; esac
    sleep 0.5
  done
  [[ $(slurm_field "$job" Restarts) == 1 ]] || fail "slurm job $job was not requeued within 90 s"
  wait_state "$job" 60 PENDING RUNNING
  # Slurm holds a requeued job for about 2 minutes (BeginTime); let it start now.
  if [[ $(slurm_state "$job") == PENDING ]]; then scontrol update JobId="$job" StartTime=now; fi
  wait_state "$job" 180 COMPLETED
  [[ $(slurm_field "$job" ExitCode) == 0:0 ]] || fail "slurm job $job exit $(slurm_field "$job" ExitCode)"
  local out="$WORK/slurm-$job.out"
  grep -q "step ended before tandem job $tjob; requeueing slurm job $job" "$out" ||
    fail "the batch output does not show the requeue"
  grep -q "resuming tandem job $tjob" "$out" || fail "the requeued run did not resume tandem job $tjob"
  grep -q "step $steps/$steps" "$out" || fail "the batch output does not show step $steps/$steps"
  grep -q "SUCCEEDED" "$out" || fail "the batch output does not show the job SUCCEEDED"
  check_model "$WORK/runs/slurm-$job/final"
  if [[ $what == workers ]]; then
    # The workers asked to leave (graceful preemption) instead of being lost.
    grep -q "is being preempted: handing it over at the next step boundary" "$out" ||
      fail "the workers did not announce their preemption to the coordinator"
    # Usually the job then checkpoints the step it is at and the requeued run
    # redoes nothing; when the handover does not finish before Slurm's
    # KillWait, the job recovers from its newest checkpoint: say which.
    if grep -q "before handing over preempted worker" "$out"; then
      log "handed over after a checkpoint: $(grep -o 'recoveries: .*' "$out" | tail -1)"
    else
      log "no checkpoint before the handover: $(grep -o 'recoveries: .*' "$out" | tail -1)"
    fi
  fi
  # The resumed job restored a checkpoint from disk instead of starting over.
  grep -Eq "restoring step [0-9]+ from disk" "$out" || fail "the resumed job did not restore a checkpoint"
  log "job $job requeued once, resumed tandem job $tjob from a checkpoint, COMPLETED"
}

log "--- 2. preemption: SIGTERM to the worker step, requeue, resume"
preempt_and_resume sft-preempt-workers workers
log "--- 3. preemption: SIGTERM to every step (coordinator too), requeue, resume"
preempt_and_resume sft-preempt-all all
log "PASS"
