#!/usr/bin/env bash
# Trains bench_sparse_quality's model and measures sparse against dense
# attention on it.
#
#   bench/sparse_decode/run.sh [BIN_DIR] [OUT_DIR]
#
# BIN_DIR holds tandemctl and bench_sparse_quality (default build/bin);
# OUT_DIR (default /tmp/tandem-sparse-quality) gets the documents, the
# model (OUT/run/final) and quality.md. Training takes about 13 minutes on
# 2 cores (stage 1: train-task.yaml, stage 2: train-docs.yaml); a model
# already in OUT is reused.
# Settings are environment variables: CONTEXTS (default "1024", the
# trained length) and SPARSE (bench flags, default "--block-size 32
# --top-k-blocks 4 --sink-blocks 1 --recent-blocks 2").
set -euo pipefail
bin=${1:-build/bin}
out=${2:-/tmp/tandem-sparse-quality}
here=$(cd "$(dirname "$0")" && pwd)
contexts=${CONTEXTS:-"1024"}
sparse=${SPARSE:-"--block-size 32 --top-k-blocks 4 --sink-blocks 1 --recent-blocks 2"}
for tool in tandemctl bench_sparse_quality; do
  [[ -x $bin/$tool ]] || { echo "run.sh: $bin/$tool not found; build first (cmake --build build)" >&2; exit 1; }
done
mkdir -p "$out"
if [[ ! -f $out/run/final/model.safetensors ]]; then
  rm -rf "$out/task" "$out/base" "$out/run"
  "$bin/tandemctl" run --local "$here/train-task.yaml" --run-dir "$out/task"
  cp -r "$out/task/final" "$out/base"
  python3 - "$out/base/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["max_position_embeddings"] = 2048
json.dump(c, open(sys.argv[1], "w"), indent=1)
PY
  python3 "$here/make_docs.py" --rows 3000 --chars 1000 --seed 1 > "$out/docs.jsonl"
  sed -e "s|MODEL_DIR|$out/base|; s|DOCS_JSONL|$out/docs.jsonl|" "$here/train-docs.yaml" > "$out/job.yaml"
  "$bin/tandemctl" run --local "$out/job.yaml" --run-dir "$out/run"
fi
: > "$out/quality.md"
for c in $contexts; do
  # shellcheck disable=SC2086  # $sparse is a list of flags
  OMP_WAIT_POLICY=PASSIVE "$bin/bench_sparse_quality" --model "$out/run/final" --context "$c" $sparse |
    tee -a "$out/quality.md"
done
