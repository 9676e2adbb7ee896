#!/usr/bin/env bash
# Builds and runs kernels_gpu_test on a machine with a CUDA GPU (the device
# tool's H200: fresh image, CUDA at /usr/local/cuda, Debian dev packages maybe
# absent). Run from the repository root:
#     bash kernels/tests/gpu/run_on_device.sh
# 1. cmake -S kernels -B /tmp/kb (Release, no benchmarks) and build
#    kernels_gpu_test; if configuring fails (e.g. no OpenBLAS/pkg-config),
#    2. fall back to compiling the reference backend + CUDA backend + test
#    directly with nvcc/g++ (they need neither OpenBLAS nor GoogleTest);
#    TANDEM_GPU_DIRECT_BUILD=1 forces this path.
# 3. Runs the test (table: op, shape, max rel err, bound, PASS/FAIL, ms), then
#    compute-sanitizer memcheck over the attention/decode checks when present.
# Every stage is bounded with `timeout`; the whole log goes to $OUT/gpu.log
# (or /tmp/gpu.log when OUT is unset). Exit status: the test's.
set -u -o pipefail

OUT_DIR="${OUT:-/tmp}"
LOG="$OUT_DIR/gpu.log"
: >"$LOG"
log() { echo "$@" | tee -a "$LOG"; }
run() {  # run <timeout_s> cmd...: output to the log and the terminal
  local limit="$1"; shift
  timeout "$limit" "$@" 2>&1 | tee -a "$LOG"
  return "${PIPESTATUS[0]}"
}

export PATH="/usr/local/cuda/bin:$PATH"
JOBS="$(nproc 2>/dev/null || echo 4)"
BUILD=/tmp/kb
BIN=""

log "== machine"
run 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
run 10 nvcc --version | tail -n 2
log "cmake: $(command -v cmake || echo none)  ninja: $(command -v ninja || echo none)  g++: $(command -v g++ || echo none)"
log "openblas pkg-config: $(pkg-config --modversion openblas 2>/dev/null || echo none)"

if [ -z "${TANDEM_GPU_DIRECT_BUILD:-}" ] && command -v cmake >/dev/null 2>&1; then
  log "== cmake configure"
  GEN=()
  command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
  if run 180 cmake -S kernels -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DTANDEM_BUILD_BENCH=OFF -DCMAKE_CUDA_ARCHITECTURES=90; then
    log "== cmake build kernels_gpu_test"
    if run 360 cmake --build "$BUILD" --target kernels_gpu_test -j "$JOBS"; then
      BIN="$BUILD/kernels_gpu_test"
    fi
  fi
fi

if [ -z "$BIN" ]; then
  log "== fallback: direct nvcc/g++ build (no OpenBLAS, no GoogleTest)"
  FB=/tmp/kb_direct
  mkdir -p "$FB"
  OMP=""
  echo 'int main(){}' | g++ -fopenmp -x c++ - -o "$FB/omp_probe" 2>/dev/null && OMP="-fopenmp"
  export FB OMP
  # One compile per source, $JOBS at a time, each bounded.
  compile() {
    local src="$1" obj="$FB/$(echo "$1" | tr '/' '_').o"
    case "$src" in
      *.cu) timeout 420 nvcc -std=c++20 -O3 -I. -DTANDEM_HAVE_CUDA=1 \
              --expt-relaxed-constexpr -lineinfo \
              -gencode=arch=compute_90,code=sm_90 -c "$src" -o "$obj" ;;
      *) timeout 300 g++ -std=c++20 -O2 -I. -DTANDEM_HAVE_CUDA=1 \
           -I/usr/local/cuda/include $OMP -c "$src" -o "$obj" ;;
    esac
  }
  export -f compile
  SRCS=(kernels/*.cc kernels/ref/*.cc kernels/cuda/*.cu kernels/tests/op_cases.cc
        kernels/tests/op_check.cc kernels/tests/gpu/*.cc)
  if printf '%s\n' "${SRCS[@]}" | xargs -P "$JOBS" -I{} bash -c 'compile "$1"' _ {} \
        >>"$LOG" 2>&1 &&
     timeout 120 nvcc -o "$FB/kernels_gpu_test" "$FB"/*.o -lcublas -lcudart ${OMP:+-Xcompiler $OMP} \
        >>"$LOG" 2>&1; then
    BIN="$FB/kernels_gpu_test"
  else
    log "fallback build FAILED (see $LOG)"
    tail -n 40 "$LOG"
    exit 2
  fi
fi

log "== run $BIN"
run 200 "$BIN"
rc=$?
log "kernels_gpu_test exit status: $rc"

if command -v compute-sanitizer >/dev/null 2>&1; then
  for f in attention decode; do
    log "== compute-sanitizer memcheck: $f"
    timeout 90 compute-sanitizer --tool memcheck --print-limit 20 "$BIN" "$f" 2>&1 \
      | grep -E "ERROR SUMMARY|Invalid|FAIL|checks|rror" | head -n 40 | tee -a "$LOG"
  done
fi
exit "$rc"
