#!/usr/bin/env bash
# Speed-proportional shards, measured with real processes: a coordinator and
# two workers, one throttled (SLOW_THREADS compute threads, default 1) and
# one not (FAST_THREADS, default 2), run the same SFT job twice - with the
# even split and with cluster.shard_by_speed (the workers calibrate at
# setup unless SPEEDS="a b" gives --speed hints) - and print one markdown
# row per run: mean step time (steps 2..N, the coordinator's sft_step phase
# time), the slowest and fastest rank's forward/backward time, the final
# loss and the load average.
#
# Usage: bench/speed_shares/demo.sh [BIN_DIR]     (default build/bin)
#   JOB=FILE (default configs/sft-arith-tiny.yaml)  STEPS=N (30)  STAGE=S (2)
#   EXTRA="--set key=value ..."
#   SLOW_CPU_QUOTA=F   throttle the slow worker with a real CPU quota instead of
#                      (or beside) fewer threads: F of one CPU (0.1-1, e.g. 0.5), a
#                      cgroup v1 cpu group (cfs_quota_us over a 10 ms period)
#                      made for it and removed at exit; needs root and a
#                      writable /sys/fs/cgroup/cpu
# Not part of the test suite (a minute or two).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="$(cd "${1:-$ROOT/build/bin}" && pwd)"
export TANDEMCTL=$BIN/tandemctl TANDEM_COORDINATOR_BIN=$BIN/tandem-coordinator TANDEM_WORKER_BIN=$BIN/tandem-worker
JOB=${JOB:-$ROOT/configs/sft-arith-tiny.yaml}
STEPS=${STEPS:-30}
STAGE=${STAGE:-2}
read -r -a EXTRA_ARGS <<<"${EXTRA:-}"
read -r -a HINTS <<<"${SPEEDS:-}"
source "$ROOT/tests/integration/lib.sh"

CGROUP=""
remove_cgroup() {
  local rc=$?
  if [[ -n "$CGROUP" && -d "$CGROUP" ]]; then
    # Back to the root group, so the directory can go even if a process lives on.
    while read -r pid; do echo "$pid" >/sys/fs/cgroup/cpu/cgroup.procs 2>/dev/null; done <"$CGROUP/cgroup.procs"
    rmdir "$CGROUP" 2>/dev/null || echo "demo: could not remove $CGROUP" >&2
  fi
  (exit $rc)
  cleanup
}
trap remove_cgroup EXIT

start_coordinator
start_worker slow --threads "${SLOW_THREADS:-1}" ${HINTS[0]:+--speed "${HINTS[0]}"}
if [[ -n "${SLOW_CPU_QUOTA:-}" ]]; then
  [[ "$SLOW_CPU_QUOTA" =~ ^(0?\.[0-9]+|1(\.0*)?)$ ]] && awk -v f="$SLOW_CPU_QUOTA" 'BEGIN { exit !(f >= 0.1) }' ||
    fail "SLOW_CPU_QUOTA must be a fraction of one CPU in [0.1, 1], e.g. 0.5 (got '$SLOW_CPU_QUOTA')"
  [[ -w /sys/fs/cgroup/cpu ]] || fail "SLOW_CPU_QUOTA needs root and a writable cgroup v1 cpu controller at /sys/fs/cgroup/cpu"
  CGROUP=/sys/fs/cgroup/cpu/tandem-speed-demo-$$
  mkdir "$CGROUP"
  echo 10000 >"$CGROUP/cpu.cfs_period_us"
  quota=$(awk -v f="$SLOW_CPU_QUOTA" 'BEGIN { print int(f * 10000) }')
  echo "$quota" >"$CGROUP/cpu.cfs_quota_us"
  echo "$LAST_WORKER_PID" >"$CGROUP/cgroup.procs"
  echo "demo: worker slow (pid $LAST_WORKER_PID) limited to $SLOW_CPU_QUOTA of one CPU" >&2
fi
start_worker fast --threads "${FAST_THREADS:-2}" ${HINTS[1]:+--speed "${HINTS[1]}"}
wait_until 60 workers_idle_at_least 2 || fail "workers did not register"

echo "| shares | mean step s | rank fwd/bwd s max / min | final loss | load average |"
echo "|---|---|---|---|---|"
for mode in false true; do
  ID=$(ctl submit "$JOB" --workers 2 --set "train.steps=$STEPS" --set "cluster.zero_stage=$STAGE" \
    --set cluster.threads_per_worker=0 --set checkpoint.every=0 --set train.eval_every=0 \
    --set "cluster.shard_by_speed=$mode" --set "name=speed-$mode" "${EXTRA_ARGS[@]}")
  follow_job "$mode" "$ID"
  wait "$FOLLOW_PID" || fail "job $mode: $(job_events "$mode" | tail -5)"
  ctl logs "$ID" 2>/dev/null | grep "shard_by_speed" | head -1 >&2 || true
  /usr/bin/python3 - "$WORK/events-$mode.jsonl" "$mode" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PY'
import json, sys
path, mode, load = sys.argv[1], sys.argv[2], sys.argv[3]
steps = {}
def walk(o):
    if isinstance(o, dict):
        if "step" in o and "phase_seconds" in o:
            steps[int(o["step"])] = o
        for v in o.values():
            walk(v)
    elif isinstance(o, list):
        for v in o:
            walk(v)
for line in open(path):
    try:
        walk(json.loads(line))
    except ValueError:
        pass
later = [steps[s] for s in sorted(steps) if s >= 2]
def mean(xs):
    return sum(xs) / max(len(xs), 1)
step_s = mean([sum(m["phase_seconds"].values()) for m in later])
ex = [m.get("extra", {}) for m in later]
cmax = mean([e.get("compute_seconds_max", 0) for e in ex])
cmin = mean([e.get("compute_seconds_min", 0) for e in ex])
loss = later[-1]["loss"] if later else float("nan")
name = "proportional" if mode == "true" else "even"
print(f"| {name} | {step_s:.3f} | {cmax:.3f} / {cmin:.3f} | {loss:.4f} | {load} |")
PY
done
