#!/usr/bin/env bash
# Decode against the PyTorch peer, in interleaved pairs so that both sides
# of a pair see the same machine load: config A, batch 16, prompt 128, 128
# new tokens (generated tokens / wall time, prefill included, on both
# sides). Each pair runs `bench_model --only decode` (3 runs; the slowest is
# kept) and then the peer once at its best setting (OMP_WAIT_POLICY=PASSIVE,
# OPENBLAS_NUM_THREADS=2, 2 torch threads; shared/BUILD-NOTES.md). Prints a
# markdown row per pair, the ratio slowest-Tandem / peer, and the smallest
# ratio of the series.
#
# Usage: bench/model/decode_vs_peer.sh [BIN_DIR]     (default build/bin)
#   PAIRS=5        number of pairs
#   KERNEL=own     "own": OPENBLAS_CORETYPE unset (OpenBLAS picks for this
#                  CPU); any other word is used as OPENBLAS_CORETYPE, for both
# Needs /usr/bin/python3 with torch (deploy/install-deps.sh --for-tests).
# Not part of the test suite (about 15 s a pair).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="$(cd "${1:-$ROOT/build/bin}" && pwd)"
PAIRS=${PAIRS:-5}
KERNEL=${KERNEL:-own}
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "decode_vs_peer: /usr/bin/python3 cannot import torch; run deploy/install-deps.sh --for-tests" >&2
  exit 1
fi
if [[ "$KERNEL" == own ]]; then
  unset OPENBLAS_CORETYPE
else
  export OPENBLAS_CORETYPE="$KERNEL"
fi
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); OpenBLAS kernel: $KERNEL; $(date -u '+%Y-%m-%d %H:%M UTC')" >&2
echo "| pair | Tandem rollout engine (3 runs, tokens/s) | PyTorch peer (tokens/s) | slowest Tandem / peer |"
echo "|---|---|---|---|"
min=""
for ((i = 1; i <= PAIRS; i++)); do
  line=$("$BIN/bench_model" --threads 2 --iters 3 --only decode | grep "rollout engine")
  lo=$(awk '{print $4}' <<<"$line")
  hi=$(awk '{print $6}' <<<"$line")
  peer=$(OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=2 /usr/bin/python3 "$ROOT/bench/pytorch/llama_peer.py" \
    --threads 2 --only decode | sed -n 's/.*decode_A *tokens_per_s=\([0-9.]*\).*/\1/p')
  if [[ -z "$lo" || -z "$peer" ]]; then
    echo "decode_vs_peer: pair $i gave no figure (Tandem: '$line', peer: '$peer')" >&2
    exit 1
  fi
  ratio=$(awk -v a="$lo" -v b="$peer" 'BEGIN {printf "%.1f", a / b}')
  echo "| $i | $lo - $hi | $peer | ${ratio}x |"
  min=$(awk -v m="$min" -v r="$ratio" 'BEGIN {print (m == "" || r < m) ? r : m}')
done
echo
echo "smallest ratio over $PAIRS pairs: ${min}x"
