#!/usr/bin/env bash
# The README's main job, end to end: `tandemctl run --local
# configs/grpo-arith-tiny.yaml` (coordinator + 2 workers, SFT warm start, then
# GRPO) must succeed and raise held-out exact-match accuracy by >= 0.2 over
# the warm-start model (issue 5). The run is deterministic: its numbers do not
# depend on timing. Bounded by the ctest TIMEOUT and `timeout`.
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
/usr/bin/python3 - "$WORK/summary.json" <<'PY'
import json, sys
s = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
before, after = s.get("accuracy_before"), s.get("accuracy_after")
print(f"main job: {s['state']} in {s['wall_seconds']:.0f} s, accuracy {before:.3f} -> {after:.3f}, "
      f"reward curve {[round(r, 2) for r in s.get('reward_curve', [])]}")
assert s["state"] == "SUCCEEDED", s
assert after - before >= 0.2, f"accuracy gain {after - before:.3f} < 0.2"
PY
[[ -f "$WORK/run/final/model.safetensors" ]] || { echo "FAIL: no final model" >&2; exit 1; }
echo "PASS"
