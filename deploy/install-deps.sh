#!/usr/bin/env bash
# Installs every Debian 12 package Tandem's build, tests and benchmarks need.
# Idempotent: packages already present are skipped; apt lists are refreshed
# only when something is missing. CUDA/NCCL are optional and come from
# /usr/local/cuda when the machine has them (never installed here).
set -euo pipefail

PACKAGES=(
  cmake g++ make ninja-build ccache pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler grpc-proto
  libspdlog-dev libyaml-cpp-dev libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev libgloo-dev libsqlite3-dev libcpp-httplib-dev nlohmann-json3-dev
  libxxhash-dev python3-grpcio python3-protobuf curl procps openssl
)
# Optional extras: --with-torch installs Debian's CPU PyTorch (about 1 GB),
# used only by bench/pytorch_peer.py as the comparison peer.
if [[ "${1:-}" == "--with-torch" ]]; then PACKAGES+=(python3-torch python3-numpy); fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
