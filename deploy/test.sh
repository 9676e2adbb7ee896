#!/usr/bin/env bash
# Installs what is missing (the build set and everything the tests use),
# builds everything and runs the whole test suite; arguments go to ctest
# (e.g. -R NAME). This is the README's test command and what .ci/run calls.
# Only GPU-only tests may skip: after ctest's own summary it prints
# "skipped: N (...)" and fails when a test skipped for another reason
# (deploy/test-summary.sh). Then the fuzz step (tests/fuzz/run.sh: builds
# build-fuzz/ with clang and runs every fuzz target TANDEM_FUZZ_SECONDS,
# default 20, each); it is left out when ctest arguments pick a subset,
# unless TANDEM_FUZZ_SECONDS is set, and TANDEM_FUZZ_SECONDS=0 leaves it out.
# Exit code: ctest's, else 1 for such a skip, else the fuzz step's.
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
cd ..

fuzz_rc=0
if [[ ${TANDEM_FUZZ_SECONDS:-} == 0 ]]; then
  echo "fuzz: left out (TANDEM_FUZZ_SECONDS=0)"
elif (($# > 0)) && [[ -z ${TANDEM_FUZZ_SECONDS:-} ]]; then
  echo "fuzz: left out (ctest arguments given; set TANDEM_FUZZ_SECONDS to run it too)"
else
  ./tests/fuzz/run.sh || fuzz_rc=$?
fi
if ((rc != 0)); then exit "$rc"; fi
if ((summary_rc != 0)); then exit "$summary_rc"; fi
exit "$fuzz_rc"
