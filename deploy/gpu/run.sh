#!/usr/bin/env bash
# Runs the packed GPU checks (deploy/gpu/pack.sh) on a GPU machine, from the
# repository root, and prints a short table. Log: $OUT/gpu-train.log.
#   1. comm_nccl_gpu_test        NCCL on one rank (device and host pointers,
#                                ordering with the legacy stream)
#   2. engine_device_path_test   the training path on the GPU: SFT on cuda
#                                vs cpu (ZeRO 0 fp32, ZeRO 3 bf16), GRPO+KL
#   3. kernels_gpu_test          every CUDA op against the reference
# CUDA's libraries come from this machine: /usr/local/cuda/lib64 and the
# nvidia-* Python wheels (cuBLAS, NCCL, cudart for CUDA 13).
set -u -o pipefail
cd "$(dirname "$0")/../.."
LOG="${OUT:-/tmp}/gpu-train.log"
: >"$LOG"
B=/tmp/gpu-bundle
mkdir -p "$B" && tar -C "$B" -xJf .gpu-bundle/bundle.tar.xz || { echo "run: no .gpu-bundle/bundle.tar.xz (carry it)"; exit 2; }
libs="$B/lib:/usr/local/cuda/lib64"
for mod in nvidia.cublas nvidia.nccl nvidia.cuda_runtime nvidia.cu13; do
  d="$(python3 -c "import $mod, os; print(os.path.dirname($mod.__file__))" 2>/dev/null || true)"
  [ -n "$d" ] && libs="$libs:$d/lib"
done
export LD_LIBRARY_PATH="$libs:${LD_LIBRARY_PATH:-}"
if ldd "$B/bin/engine_device_path_test" 2>&1 | grep "GLIBCXX\|CXXABI\|libstdc++.*not found" >/dev/null; then
  echo "run: this machine's C++ runtime is older than the build's: using the packed one" | tee -a "$LOG"
  export LD_LIBRARY_PATH="$B/lib-cxx:$LD_LIBRARY_PATH"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee -a "$LOG"
declare -A RESULT
for t in comm_nccl_gpu_test engine_device_path_test kernels_gpu_test; do
  echo "== $t" | tee -a "$LOG"
  ldd "$B/bin/$t" | grep "not found" | tee -a "$LOG"
  start=$(date +%s)
  filter=()
  [ "$t" = engine_device_path_test ] && filter=(--gtest_filter='DeviceCudaTest.*:DeviceSetupTest.*')
  timeout 240 "$B/bin/$t" "${filter[@]}" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  RESULT[$t]="rc=$rc $(( $(date +%s) - start ))s"
done
echo "== summary" | tee -a "$LOG"
for t in comm_nccl_gpu_test engine_device_path_test kernels_gpu_test; do
  printf '%-26s %s\n' "$t" "${RESULT[$t]}" | tee -a "$LOG"
done
grep -h "\[device-cuda\]" "$LOG" || true
