#!/usr/bin/env bash
# Installs what is missing (the build set and everything the tests use),
# builds everything and runs the whole test suite.
# This is the README's test command and what .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/install-deps.sh --for-tests
./deploy/build.sh
cd build
# Tests run two at a time (the CI machine has 2 cores); each has its own
# timeout set in CMake. --output-on-failure prints the log of a failing test.
ctest --output-on-failure -j "${CTEST_JOBS:-2}" --timeout 600 "$@"
