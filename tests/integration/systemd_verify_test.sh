#!/usr/bin/env bash
# deploy/systemd units pass `systemd-analyze verify` (package systemd; the
# test fails and names it where systemd-analyze is missing). ExecStart paths
# are pointed at the built binaries (or /bin/true) because verify checks
# that they exist.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
source "$ROOT/tests/support/require.sh"
require_program systemd-analyze systemd
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cp "$ROOT"/deploy/systemd/*.service "$TMP/"
COORD=${TANDEM_COORDINATOR_BIN:-/bin/true}
WORKER=${TANDEM_WORKER_BIN:-/bin/true}
sed -i "s#/usr/local/bin/tandem-coordinator#$COORD#; s#/usr/local/bin/tandem-worker#$WORKER#" "$TMP"/*.service
cd "$TMP"
out=$(systemd-analyze verify ./tandem-coordinator.service ./tandem-worker@.service 2>&1) || {
  echo "$out"; echo "FAIL: systemd-analyze verify"; exit 1; }
# verify prints warnings without failing for unknown keys: treat them as errors.
if grep -E "Unknown key|Unknown section|Failed to parse|ignoring" <<<"$out"; then
  echo "FAIL: warnings from systemd-analyze"; exit 1
fi
echo "PASS: $(ls "$TMP" | tr '\n' ' ')"
