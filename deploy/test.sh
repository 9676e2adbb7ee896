#!/usr/bin/env bash
# Installs what is missing (the build set and everything the tests use),
# builds everything and runs the whole test suite; arguments go to ctest
# (e.g. -R NAME). This is the README's test command and what .ci/run calls.
# Only GPU-only tests may skip: after ctest's own summary it prints
# "skipped: N (...)" and fails when a test skipped for another reason
# (deploy/test-summary.sh). Exit code: ctest's, else 1 for such a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/install-deps.sh --for-tests
./tests/support/fetch-test-data.sh
./deploy/build.sh
cd build
out=$(mktemp "${TMPDIR:-/tmp}/tandem-ctest.XXXXXX")
trap 'rm -f "$out"' EXIT
# Tests run two at a time (the CI machine has 2 cores); each has its own
# timeout set in CMake. --output-on-failure prints the log of a failing test.
rm -f Testing/Temporary/LastTest.log  # test-summary.sh reads this run's
rc=0
ctest --output-on-failure -j "${CTEST_JOBS:-2}" --timeout 600 "$@" 2>&1 | tee "$out" || rc=${PIPESTATUS[0]}
summary_rc=0
../deploy/test-summary.sh "$out" . || summary_rc=$?
if ((rc != 0)); then exit "$rc"; fi
exit "$summary_rc"
