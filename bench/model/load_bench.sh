#!/usr/bin/env bash
# Model load: peak memory and time of loading a bf16 checkpoint and
# generating from it. Writes a randomly initialised model with Qwen2.5-0.5B's
# config.json (bench/model/qwen2.5-0.5b-config.json: 494M parameters, tied,
# vocabulary 151936) as BF16 safetensors with `tandem-model-tool model init`,
# then runs `tandem-model-tool generate` on it (32 greedy tokens) under
# /usr/bin/time -v and prints the peak RSS against the fp32 weights
# (parameters x 4 bytes) and the load time. Not part of the test suite
# (about 1 GB written, 2-3 GB of memory).
#
# Usage: bench/model/load_bench.sh [BIN_DIR]      (default build/bin)
#   OUT=DIR (default a fresh /tmp directory, removed at the end)
#   THREADS=N (default 2)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="$(cd "${1:-$ROOT/build/bin}" && pwd)"
THREADS=${THREADS:-2}
OUT=${OUT:-}
if [[ -z "$OUT" ]]; then
  OUT=$(mktemp -d /tmp/tandem-load-bench.XXXXXX)
  trap 'rm -rf "$OUT"' EXIT
fi
mkdir -p "$OUT"
export OMP_WAIT_POLICY=PASSIVE

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
/usr/bin/time -v "$BIN/tandem-model-tool" model init --config "$ROOT/bench/model/qwen2.5-0.5b-config.json" \
  --seed 1 --dtype BF16 --out "$OUT/model" 2>"$OUT/init.time"
init_rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$OUT/init.time")
echo "init: $(du -b "$OUT/model/model.safetensors" | cut -f1) bytes of BF16 safetensors, peak RSS ${init_rss} kB"

/usr/bin/time -v "$BIN/tandem-model-tool" generate --model "$OUT/model" --prompt-ids 151643,40,1079,264 \
  --max-new-tokens 32 --greedy --threads "$THREADS" --output json >"$OUT/generate.json" 2>"$OUT/generate.time"
rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$OUT/generate.time")
wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$OUT/generate.time")
/usr/bin/python3 - "$OUT/generate.json" "$rss" "$wall" <<'EOF'
import json, sys
g = json.load(open(sys.argv[1]))
rss_kb, wall = int(sys.argv[2]), sys.argv[3]
params = 494032768  # ParameterCount of the config
fp32 = params * 4
n = len(g["samples"][0]["ids"])
print(f"generate: load {g['load_seconds']:.2f} s, prefill {g['prefill_seconds']:.3f} s, "
      f"{n} tokens decoded in {g['decode_seconds']:.2f} s, wall {wall}")
print(f"peak RSS {rss_kb * 1024 / 1e9:.3f} GB = {rss_kb * 1024 / fp32:.2f} x the fp32 weights "
      f"({fp32 / 1e9:.3f} GB)")
EOF
