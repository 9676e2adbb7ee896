#!/usr/bin/env bash
# The main job's promise, checked across machines' numerics: runs
# configs/grpo-arith-tiny.yaml through `tandemctl run --local` for every
# combination of seed, OpenBLAS kernel choice and worker count, and prints
# one markdown table row per run (held-out exact match after the SFT warm
# start and after GRPO, the gain, wall time and the reward curve).
#
# Usage: bench/main_job/matrix.sh [BIN_DIR]        (default build/bin)
#   SEEDS="1 2 3 4 5"  KERNELS="own Haswell"  WORKERS="1 2"  OUT=DIR  JOB=FILE
#   EXTRA="--set key=value ..."   (passed to tandemctl run)
# "own" runs with OPENBLAS_CORETYPE unset (OpenBLAS picks the kernel for this
# CPU, as on a user's machine); any other word is used as OPENBLAS_CORETYPE.
# Runs are sequential, so each wall time is the whole job alone on the
# machine. Not part of the test suite (about 20 runs of 1-3 minutes).
# Exits 1 when any run failed or gained less than MIN_GAIN (default 0.25).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="$(cd "${1:-$ROOT/build/bin}" && pwd)"
SEEDS=${SEEDS:-"1 2 3 4 5"}
KERNELS=${KERNELS:-"own Haswell"}
WORKERS=${WORKERS:-"1 2"}
JOB=${JOB:-$ROOT/configs/grpo-arith-tiny.yaml}
OUT=${OUT:-$(mktemp -d /tmp/tandem-main-job-matrix.XXXXXX)}
MIN_GAIN=${MIN_GAIN:-0.25}
read -r -a EXTRA_ARGS <<<"${EXTRA:-}"
mkdir -p "$OUT"
export OMP_WAIT_POLICY=PASSIVE

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); job: $JOB; runs in $OUT" >&2
echo "| kernel | workers | seed | accuracy after warm start | after GRPO | gain | wall time | reward curve (10 spans) |"
echo "|---|---|---|---|---|---|---|---|"
bad=0
for kernel in $KERNELS; do
  for workers in $WORKERS; do
    for seed in $SEEDS; do
      run="$OUT/$kernel-w$workers-s$seed"
      env_args=(env -u OPENBLAS_CORETYPE)
      [[ "$kernel" == own ]] || env_args+=("OPENBLAS_CORETYPE=$kernel")
      start=$(date +%s.%N)
      rc=0
      "${env_args[@]}" "$BIN/tandemctl" run --local "$JOB" --workers "$workers" --set "seed=$seed" \
        "${EXTRA_ARGS[@]}" --run-dir "$run" --output json >"$run.json" 2>"$run.err" || rc=$?
      end=$(date +%s.%N)
      row=$(/usr/bin/python3 - "$run.json" "$start" "$end" "$rc" "$MIN_GAIN" <<'PY'
import json, sys
path, start, end, rc, min_gain = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
wall = end - start
try:
    s = json.loads(open(path).read().strip().splitlines()[-1])
except (OSError, ValueError, IndexError):
    print(f"| - | - | FAILED (exit {rc}, no summary) | {wall:.0f} s | |")
    sys.exit(1)
b, a = s.get("accuracy_before", float("nan")), s.get("accuracy_after", float("nan"))
ok = rc == 0 and s.get("state") == "SUCCEEDED" and a - b >= min_gain
curve = " ".join(f"{r:.2f}" for r in s.get("reward_curve", []))
mark = "" if ok else f" **FAIL** ({s.get('state')})"
print(f"| {b:.3f} | {a:.3f} | {a - b:+.3f}{mark} | {int(wall // 60)} min {wall % 60:.0f} s | {curve} |")
sys.exit(0 if ok else 1)
PY
) || bad=$((bad + 1))
      echo "| $kernel | $workers | $seed $row"
    done
  done
done
echo "$bad run(s) failed or gained less than $MIN_GAIN" >&2
((bad == 0))
