#!/usr/bin/env bash
# Builds the fuzz targets (build-fuzz/: clang, libFuzzer, ASan + UBSan,
# -DTANDEM_FUZZ=ON) and runs each for a bounded time over a copy of its seed
# corpus (tests/fuzz/README.md). deploy/test.sh runs it after ctest.
#   tests/fuzz/run.sh                  every target
#   tests/fuzz/run.sh rpc safetensors  only these
#   TANDEM_FUZZ_SECONDS=300 tests/fuzz/run.sh model_config
#   TANDEM_FUZZ_BUILD_ONLY=1 tests/fuzz/run.sh
# One target at a time, one process each. A crash, leak, sanitizer report,
# timeout (> 10 s for one input) or allocation past 2 GB fails the run: the
# input is saved under build-fuzz/crashes/<target>/; its path, the command
# that replays it, the report and (up to 4 KB) the input in base64 are
# printed. Exit code: 0 when every target ran clean, 1 when one failed, 2 on
# a usage or build error.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=$ROOT/build-fuzz
SECONDS_PER_TARGET=${TANDEM_FUZZ_SECONDS:-20}
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/tandem-ccache}"
export CCACHE_BASEDIR="$ROOT"

# Every target: its name (tests/fuzz/<name>_fuzz.cc, corpus/<name>/) and the
# largest input it is given (-max_len): a few times its largest seed.
declare -A MAX_LEN=(
  [safetensors]=8192
  [model_config]=4096
  [job_yaml]=8192
  [ckpt_manifest]=4096
  [ckpt_shard]=4096
  [rpc]=2048
  [tokenizer_json]=16384
  [chat_template]=8192
  [daemon_config]=8192
  [jsonl_row]=4096
)
ALL=(safetensors model_config job_yaml ckpt_manifest ckpt_shard rpc tokenizer_json chat_template daemon_config jsonl_row)

targets=("$@")
if ((${#targets[@]} == 0)); then targets=("${ALL[@]}"); fi
for t in "${targets[@]}"; do
  if [[ -z ${MAX_LEN[$t]+set} ]]; then
    echo "fuzz: unknown target '$t'; targets: ${ALL[*]}" >&2
    exit 2
  fi
done
if ! [[ $SECONDS_PER_TARGET =~ ^[0-9]+$ ]] || ((SECONDS_PER_TARGET < 1)); then
  echo "fuzz: TANDEM_FUZZ_SECONDS must be a positive integer, got '$SECONDS_PER_TARGET'" >&2
  exit 2
fi
for tool in clang clang++; do
  if ! command -v "$tool" >/dev/null; then
    echo "fuzz: $tool not found: install clang libclang-rt-14-dev (deploy/install-deps.sh --for-tests)" >&2
    exit 2
  fi
done

start=$(date +%s)
mkdir -p "$BUILD"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DTANDEM_FUZZ=ON \
  >"$BUILD/configure.log" 2>&1 || { cat "$BUILD/configure.log" >&2; echo "fuzz: configure failed" >&2; exit 2; }
if ! cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target fuzz; then
  echo "fuzz: build failed" >&2
  exit 2
fi
echo "fuzz: built ${#ALL[@]} targets in $(($(date +%s) - start)) s"
if [[ -n ${TANDEM_FUZZ_BUILD_ONLY:-} ]]; then exit 0; fi

# Scratch files of the targets (written for every input): memory when
# possible.
scratch_root=/dev/shm
if ! [[ -d $scratch_root && -w $scratch_root ]]; then scratch_root=$BUILD; fi
scratch=$(mktemp -d "$scratch_root/tandem-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export TMPDIR=$scratch
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

failed=()
for t in "${targets[@]}"; do
  bin=$BUILD/bin/fuzz_$t
  seeds=$ROOT/tests/fuzz/corpus/$t
  corpus=$BUILD/corpus/$t  # seeds plus what this and earlier runs found
  crashes=$BUILD/crashes/$t
  log=$BUILD/logs/$t.log
  mkdir -p "$corpus" "$crashes" "$(dirname "$log")"
  cp -f "$seeds"/* "$corpus"/
  rm -f "$crashes"/*
  rc=0
  "$bin" "$corpus" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 \
    -max_len="${MAX_LEN[$t]}" -artifact_prefix="$crashes/" -print_final_stats=1 >"$log" 2>&1 || rc=$?
  runs=$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$log" | tail -1 | grep -oE '[0-9]+$' || true)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 || true)
  if ((rc == 0)); then
    echo "fuzz: $t: ok, ${runs:-?} inputs in ${SECONDS_PER_TARGET} s (${cov:-cov: ?}, corpus $(ls "$corpus" | wc -l) files)"
    continue
  fi
  failed+=("$t")
  echo "fuzz: $t: FAILED (exit $rc) after ${runs:-?} inputs; log: $log" >&2
  # The report: from the first error line, 40 lines (the stack trace).
  awk '/ERROR: |runtime error|invariant broken|terminate called/ { p = 1 } p && n < 40 { print; n++ }' \
    "$log" >&2
  for f in "$crashes"/*; do
    [[ -e $f ]] || continue
    echo "fuzz: $t: failing input: $f" >&2
    echo "fuzz:   reproduce: $bin $f" >&2
    # CI machines do not keep build-fuzz/: the input itself, when small.
    if (($(stat -c %s "$f") <= 4096)); then echo "fuzz:   input (base64): $(base64 -w0 "$f")" >&2; fi
  done
done
echo "fuzz: done in $(($(date +%s) - start)) s"
if ((${#failed[@]} > 0)); then
  echo "fuzz: failed: ${failed[*]} (tests/fuzz/README.md: reproducing a crash)" >&2
  exit 1
fi
