#!/usr/bin/env bash
# Packs the GPU test programs built HERE (with CUDA, x86-64) and the shared
# libraries they need that a bare CUDA image lacks (gRPC, protobuf, Abseil,
# Gloo, OpenBLAS, spdlog, yaml-cpp, ...) into .gpu-bundle/ (git-ignored), so
# the device tool can carry them to a GPU machine whose image has CUDA but
# not the Debian -dev packages. CUDA's own libraries (cudart, cuBLAS, NCCL)
# are NOT packed: the run script takes them from the GPU machine.
#   ./deploy/build.sh && bash deploy/gpu/pack.sh [build-dir]
# then run `bash deploy/gpu/run.sh` there with carry: [".gpu-bundle"]
# (see docs/gpu.md, "Running the GPU checks").
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD="${1:-build}"
DEST=.gpu-bundle
PROGRAMS=(engine_device_path_test comm_nccl_gpu_test kernels_gpu_test)
rm -rf "$DEST"
mkdir -p "$DEST/bin" "$DEST/lib"
for p in "${PROGRAMS[@]}"; do
  src="$(find "$BUILD" -type f -name "$p" -perm -u+x | head -n 1)"
  if [ -z "$src" ]; then
    echo "pack: $p not found under $BUILD (build it first: cmake --build $BUILD --target $p)" >&2
    exit 1
  fi
  cp "$src" "$DEST/bin/$p"
  strip --strip-debug "$DEST/bin/$p"
done
# Shared libraries: everything ldd resolves, except the C runtime and CUDA's
# (the GPU machine has its own, matched to its driver).
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libpthread|libdl\.|librt\.|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas|libnccl|libnvidia)'
for p in "$DEST"/bin/*; do
  ldd "$p" | awk '/=> \//{print $1" "$3}' | while read -r name path; do
    if ! echo "$name" | grep -Eq "$skip"; then cp -L -n "$path" "$DEST/lib/$name"; fi
  done
done
# The C++ runtime it was built with, used there only when the machine's own
# is older (run.sh checks with ldd).
mkdir -p "$DEST/lib-cxx"
for p in "$DEST"/bin/*; do
  ldd "$p" | awk '/(libstdc\+\+|libgcc_s)[^ ]* => \//{print $1" "$3}' | while read -r name path; do
    cp -L -n "$path" "$DEST/lib-cxx/$name"
  done
done
strip --strip-unneeded "$DEST"/lib/* 2>/dev/null || true
# One compressed archive: the working tree that travels is limited to 64 MiB
# (OpenBLAS alone is ~36 MB unpacked).
tar -C "$DEST" -cJf "$DEST.tar.xz" bin lib lib-cxx
rm -rf "$DEST"/bin "$DEST"/lib "$DEST"/lib-cxx
mv "$DEST.tar.xz" "$DEST/bundle.tar.xz"
du -sh "$DEST/bundle.tar.xz"
echo "pack: carry .gpu-bundle (limit 64 MiB) and run: bash deploy/gpu/run.sh"
