#!/usr/bin/env bash
# Configures and builds Tandem into build/ (Release, Ninja, ccache).
# Usage: deploy/build.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/tandem-ccache}"
export CCACHE_BASEDIR="$PWD"
JOBS="${JOBS:-$(nproc)}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$JOBS"
