#!/usr/bin/env bash
# What a test needs from the machine. A missing program or Python module
# fails the test (exit 1) with the Debian package to install; no test skips
# for a missing dependency (only tests that need a GPU skip).
#
# Sourced by a test script:
#   source tests/support/require.sh
#   require_program openssl openssl
#   require_python_module grpc python3-grpcio
# Or run in front of a test command (ctest's add_test):
#   bash tests/support/require.sh --program /usr/bin/python3 python3 \
#       --python-module grpc python3-grpcio -- COMMAND ARGS...
# Python modules are checked with /usr/bin/python3 (Debian's packages
# install into it, not into a python3 that comes first on PATH).

TANDEM_INSTALL_HINT="deploy/install-deps.sh --for-tests"

# require_fail WHAT PACKAGE: prints the missing thing and the package, exits 1.
require_fail() {
  echo "FAIL: $1: install $2: $TANDEM_INSTALL_HINT" >&2
  exit 1
}

# require_program PROGRAM PACKAGE: PROGRAM (a name on PATH or a path) runs here.
require_program() {
  command -v "$1" >/dev/null 2>&1 || require_fail "$1 not found" "$2"
}

# require_python_module MODULE PACKAGE: /usr/bin/python3 imports MODULE.
require_python_module() {
  require_program /usr/bin/python3 python3
  /usr/bin/python3 -c "import $1" >/dev/null 2>&1 ||
    require_fail "/usr/bin/python3 cannot import $1" "$2"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  while (($# > 0)); do
    case "$1" in
      --program) require_program "$2" "$3"; shift 3 ;;
      --python-module) require_python_module "$2" "$3"; shift 3 ;;
      --) shift; break ;;
      *) echo "require.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
  done
  (($# > 0)) || { echo "require.sh: no command after --" >&2; exit 2; }
  exec "$@"
fi
