#!/usr/bin/env bash
# After ctest: prints how many tests skipped and why, and fails (exit 1) when
# one skipped for any reason but a missing GPU. Only GPU-only tests may skip,
# and they say "no CUDA device" when they do (kernels_gpu_test,
# DeviceCudaTest, comm_nccl_gpu_test); a missing package fails its test
# instead (tests/support/require.sh).
# usage: deploy/test-summary.sh CTEST_OUTPUT [BUILD_DIR]
#   CTEST_OUTPUT  what ctest printed (its "did not run" list names the
#                 skipped and disabled tests)
#   BUILD_DIR     where ctest ran (default build/); each test's output is
#                 read from Testing/Temporary/LastTest.log there
# A test that passed but whose output has GoogleTest's "[  SKIPPED ]" (a
# GoogleTest binary run as one ctest test) counts as skipped too.
set -euo pipefail
out=${1:?usage: deploy/test-summary.sh CTEST_OUTPUT [BUILD_DIR]}
log="${2:-build}/Testing/Temporary/LastTest.log"
[[ -f "$log" ]] || log=/dev/null

# One line per test that did not run or skipped inside: NAME<TAB>REASON.
# The reason: a line with "no CUDA device", else GoogleTest's skip message,
# else the first line that mentions a skip, else its last line of output.
skips=$(awk -v out="$out" '
  # ctest: "The following tests did not run:" then "\t  12 - NAME (Skipped)".
  FILENAME == out {
    if ($0 ~ /^The following tests did not run:/) { in_list = 1; next }
    if (in_list && match($0, /^\t *[0-9]+ - /)) {
      entry = substr($0, RLENGTH + 1)
      name = entry; sub(/ \([^()]*\)$/, "", name)
      why = entry; sub(/^.* \(/, "", why); sub(/\)$/, "", why)
      listed[name] = why; order[++n] = name
      next
    }
    in_list = 0
    next
  }
  # LastTest.log: "3/7 Testing: NAME", "Output:", dashes, lines,
  # "<end of output>", then "Test Passed." or "Test Pass Reason:" etc.
  /^[0-9]+\/[0-9]+ Testing: / { test = $0; sub(/^[0-9]+\/[0-9]+ Testing: /, "", test); next }
  /^Output:$/ { in_out = 1; first = 1; after_skip = 0; next }
  in_out && first && /^-+$/ { first = 0; next }
  /^<end of output>$/ { in_out = 0; next }
  in_out {
    first = 0
    if ($0 ~ /[^ ]/ && $0 !~ /^\[  SKIPPED \]/) last[test] = $0
    if ($0 ~ /\[  SKIPPED \]/) gskip[test] = 1
    if ($0 ~ /no CUDA device/) cuda[test] = $0
    # GoogleTest: "file.cc:12: Skipped", then the GTEST_SKIP() message.
    if (after_skip && !(test in gmsg)) gmsg[test] = $0
    after_skip = $0 ~ /: Skipped$/
    if (!(test in other) && tolower($0) ~ /skip/ && $0 !~ /^\[  SKIPPED \]/ && $0 !~ /: Skipped$/)
      other[test] = $0
    next
  }
  /^Test Passed\.$/ { if (gskip[test]) order[++n] = test }
  END {
    for (i = 1; i <= n; i++) {
      t = order[i]
      if (t in seen) continue
      seen[t] = 1
      if (t in cuda) r = cuda[t]
      else if (t in gmsg) r = gmsg[t]
      else if (t in other) r = other[t]
      else if (t in last) r = last[t]
      else if (t in listed) r = listed[t]
      else r = "no reason printed"
      printf "%s\t%s\n", t, r
    }
  }' "$out" "$log")

if [[ -z "$skips" ]]; then
  echo "skipped: 0"
  exit 0
fi
total=$(wc -l <<<"$skips")
gpu=$(grep 'no CUDA device' <<<"$skips" || true)
other=$(grep -v 'no CUDA device' <<<"$skips" || true)
names() { cut -f1 <<<"$1" | paste -sd, - | sed 's/,/, /g'; }
if [[ -z "$other" ]]; then
  echo "skipped: $total (all need a CUDA device: $(names "$gpu"))"
  exit 0
fi
nother=$(wc -l <<<"$other")
if [[ -n "$gpu" ]]; then
  echo "skipped: $total (no CUDA device for $(wc -l <<<"$gpu"): $(names "$gpu"); other reasons for $nother)"
else
  echo "skipped: $total (other reasons for $nother)"
fi
echo "FAIL: $nother test(s) skipped for a reason other than a missing CUDA device;" \
  "only GPU-only tests may skip (a missing package must fail its test, naming the package):"
while IFS=$'\t' read -r name why; do
  echo "  $name: $why"
done <<<"$other"
exit 1
