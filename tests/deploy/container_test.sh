#!/usr/bin/env bash
# deploy/docker/cpu.Dockerfile built with podman and run: the image is built
# on a Debian 12 base image made here with debootstrap (no container registry
# is needed), with the CPU programs of this build tree (--build-arg
# BINARIES=prebuilt), and then `tandemctl run --local` runs the tiny SFT job
# with 2 workers inside the container (no network, the image's unprivileged
# user); the exported model comes out through a mounted run directory.
#
# Needs root (rootful podman), podman, runc and debootstrap; fails and names
# what is missing otherwise. Images live in a podman storage of their own,
# kept between runs: ${TANDEM_CONTAINER_CACHE:-$HOME/.cache/tandem-containers}
# (the base image, about 200 MB, is made once in 2-3 minutes; the runtime
# stage's apt-get layer is cached). A build tree compiled with CUDA gets a
# CPU-only build of the three programs next to it first (<build>-cpu, at the
# same depth so that ccache's relative paths hit: about a minute warm).
# Podman runs with runc and explicit ulimits, which also work where crun
# cannot (cgroup v1/v2 hybrid hosts, hard limits below podman's defaults).
set -euo pipefail
: "${TANDEMCTL:?}"
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
source "$ROOT/tests/support/require.sh"
require_program podman podman
require_program runc runc
require_program debootstrap debootstrap
((EUID == 0)) || { echo "FAIL: rootful podman needs root (this test runs as uid $EUID)" >&2; exit 1; }
BIN="$(dirname "$TANDEMCTL")"
BUILD_DIR="$(dirname "$BIN")"
CACHE="${TANDEM_CONTAINER_CACHE:-$HOME/.cache/tandem-containers}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/tandem-container.XXXXXX")"
BASE_IMAGE=localhost/tandem-base/debian:12
IMAGE=localhost/tandem-test/tandem:cpu
# The runroot is recorded in the storage's database, so it is fixed too.
P=(podman --root "$CACHE/storage" --runroot "$CACHE/run" --storage-driver overlay --runtime runc)
LIMITS=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)

log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
fail() { log "FAIL: $*"; exit 1; }
cleanup() {
  local rc=$?
  set +e
  "${P[@]}" rm -f -t 5 tandem-container-test >/dev/null 2>&1
  "${P[@]}" image prune -f >/dev/null 2>&1  # layers of images this build replaced
  if [[ $rc -eq 0 && -z "${KEEP_WORK:-}" ]]; then rm -rf "$WORK"; else log "kept $WORK"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
mkdir -p "$CACHE"

# 1. The Debian 12 base image, from the mirror apt uses (once).
if ! "${P[@]}" image exists "$BASE_IMAGE"; then
  mirror=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  [[ -n "$mirror" ]] || mirror=$(awk '$1 == "deb" && $3 == "bookworm" { print $2; exit }' /etc/apt/sources.list 2>/dev/null)
  mirror=${TANDEM_DEBIAN_MIRROR:-${mirror:-http://deb.debian.org/debian}}
  log "making $BASE_IMAGE with debootstrap from $mirror"
  timeout 600 debootstrap --variant=minbase bookworm "$WORK/rootfs" "$mirror" >"$WORK/debootstrap.log" 2>&1 ||
    { tail -n 20 "$WORK/debootstrap.log" >&2; fail "debootstrap failed"; }
  tar -C "$WORK/rootfs" -c . | "${P[@]}" import --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >"$WORK/import.log" 2>&1 ||
    { tail -n 20 "$WORK/import.log" >&2; fail "podman import of the base image failed"; }
  rm -rf "$WORK/rootfs"
fi

# 2. CPU binaries: this tree's, unless they were built with CUDA.
# (grep without -q reads all of ldd's output: with -q it could exit first and
# ldd's SIGPIPE would fail the pipeline under pipefail, taking the CUDA build.)
if ldd "$BIN/tandem-worker" | grep -E "libcudart|libnccl|libcublas" >/dev/null; then
  CPU_BUILD="$BUILD_DIR-cpu"
  log "this build has CUDA: building the CPU-only programs in $CPU_BUILD"
  export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/tandem-ccache}" CCACHE_BASEDIR="$ROOT"
  cmake -S "$ROOT" -B "$CPU_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_ENABLE_CUDA=OFF \
    -DTANDEM_BUILD_TESTS=OFF -DTANDEM_BUILD_BENCH=OFF >"$WORK/cmake.log" 2>&1 ||
    { tail -n 20 "$WORK/cmake.log" >&2; fail "configuring the CPU-only build failed"; }
  cmake --build "$CPU_BUILD" -j2 --target tandem-coordinator tandem-worker tandemctl \
    >"$WORK/cmake.log" 2>&1 || { tail -n 30 "$WORK/cmake.log" >&2; fail "the CPU-only build failed"; }
  BIN="$CPU_BUILD/bin"
fi

# 3. The image: the Dockerfile's runtime stage with these binaries.
mkdir -p "$WORK/context/prebuilt" "$WORK/context/deploy"
cp "$BIN/tandem-coordinator" "$BIN/tandem-worker" "$BIN/tandemctl" "$WORK/context/prebuilt/"
cp -r "$ROOT/configs" "$WORK/context/"
cp "$ROOT/deploy/install-deps.sh" "$WORK/context/deploy/"
log "building $IMAGE from deploy/docker/cpu.Dockerfile"
"${P[@]}" build --network host "${LIMITS[@]}" --layers -f "$ROOT/deploy/docker/cpu.Dockerfile" \
  --build-arg BASE="$BASE_IMAGE" --build-arg BINARIES=prebuilt -t "$IMAGE" "$WORK/context" \
  >"$WORK/build.log" 2>&1 || { tail -n 30 "$WORK/build.log" >&2; fail "podman build failed"; }
[[ $("${P[@]}" image inspect --format '{{.Config.User}}' "$IMAGE") == 10001:10001 ]] ||
  fail "the image does not run as 10001:10001"

# 4. The entrypoint answers, and a local job runs inside the container.
"${P[@]}" run --rm --network none "${LIMITS[@]}" "$IMAGE" --help >"$WORK/help.txt" 2>&1 ||
  { cat "$WORK/help.txt" >&2; fail "tandem-coordinator --help failed in the image"; }
grep -q "^Usage: tandem-coordinator" "$WORK/help.txt" || fail "the entrypoint is not tandem-coordinator"
mkdir -p "$WORK/job" "$WORK/out"
cp "$ROOT/tests/integration/jobs/sft-tiny.yaml" "$WORK/job/"
chown 10001:10001 "$WORK/out"
log "tandemctl run --local inside the container"
timeout 180 "${P[@]}" run --rm --name tandem-container-test --network none "${LIMITS[@]}" \
  -v "$WORK/job:/job:ro" -v "$WORK/out:/out" --entrypoint tandemctl "$IMAGE" \
  run --local --workers 2 --run-dir /out/run /job/sft-tiny.yaml >"$WORK/run.txt" 2>&1 ||
  { tail -n 30 "$WORK/run.txt" >&2; fail "tandemctl run --local failed in the container"; }
grep -q "SUCCEEDED" "$WORK/run.txt" || { cat "$WORK/run.txt" >&2; fail "the job did not succeed"; }
grep -q "steps *4/4" "$WORK/run.txt" || { cat "$WORK/run.txt" >&2; fail "the job did not run 4 steps"; }
[[ -f "$WORK/out/run/final/config.json" ]] || fail "no exported model in the mounted run directory"
ls "$WORK/out/run/final"/*.safetensors >/dev/null 2>&1 || fail "no safetensors in the exported model"
log "PASS: $(grep -m1 '^steps' "$WORK/run.txt")"
