#!/usr/bin/env bash
# The README's main job, end to end, as a user gets it: `tandemctl run --local
# configs/grpo-arith-tiny.yaml` (coordinator + 2 workers, SFT warm start, then
# GRPO) with this machine's own environment must succeed, raise held-out
# exact-match accuracy by at least MIN_GAIN (the README's promise, 0.25; every
# run of bench/main_job/matrix.sh clears it with margin, docs/benchmarks.md),
# show a rising reward curve and leave the final model with its tokenizer.
# The run is deterministic for a given BLAS kernel: its numbers do not depend
# on timing. Bounded by the ctest TIMEOUT and `timeout`.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
source "$ROOT/tests/support/require.sh"
require_program /usr/bin/python3 python3
: "${TANDEMCTL:?TANDEMCTL must point at the tandemctl binary}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export OMP_WAIT_POLICY=PASSIVE
timeout 900 "$TANDEMCTL" run --local "$ROOT/configs/grpo-arith-tiny.yaml" --run-dir "$WORK/run" \
  --output json > "$WORK/summary.json" 2> "$WORK/stderr.txt" || {
  cat "$WORK/stderr.txt" >&2; tail -n 50 "$WORK/run/coordinator.log" >&2 || true
  echo "FAIL: the main job did not succeed" >&2; exit 1; }
/usr/bin/python3 - "$WORK/summary.json" "${MIN_GAIN:-0.25}" <<'PY'
import json, sys
s = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
min_gain = float(sys.argv[2])
before, after = s.get("accuracy_before"), s.get("accuracy_after")
print(f"main job: {s['state']} in {s['wall_seconds']:.0f} s, accuracy {before:.3f} -> {after:.3f}, "
      f"reward curve {[round(r, 2) for r in s.get('reward_curve', [])]}")
assert s["state"] == "SUCCEEDED", s
assert after - before >= min_gain, f"accuracy gain {after - before:.3f} < {min_gain}"
curve = s.get("reward_curve", [])
assert len(curve) == 10, f"reward curve has {len(curve)} spans, expected 10"
assert curve[-1] >= curve[0] + 0.2, f"reward curve does not rise: {curve}"
PY
for f in model.safetensors config.json tokenizer.json; do
  [[ -f "$WORK/run/final/$f" ]] || { echo "FAIL: no final/$f" >&2; exit 1; }
done
echo "PASS"
