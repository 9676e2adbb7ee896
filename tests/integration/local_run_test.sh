#!/usr/bin/env bash
# tandemctl run --local: succeeds with 2 workers, writes metrics.jsonl (one
# object per step) and final/, prints a summary, and leaves no process
# behind - after success, after SIGINT mid-run, and after SIGKILL of tandemctl
# (PR_SET_PDEATHSIG).
source "$(dirname "$0")/lib.sh"
require_program pgrep procps
JOB="$TI_DIR/jobs/sft-tiny.yaml"

# Processes whose command line names this run dir (the state dir / token paths).
leftovers() { pgrep -f -- "$1/" || true; }
no_leftovers() { [[ -z "$(leftovers "$1")" ]]; }

RUN="$WORK/run-ok"
expect_exit 0 timeout 300 "$TANDEMCTL" run --local --workers 2 --run-dir "$RUN" "$JOB"
expect_output "SUCCEEDED"
expect_output "steps"
lines=$(grep -c '"step"' "$RUN/metrics.jsonl" || true)
((lines == 4)) || fail "metrics.jsonl has $lines step lines, want 4"
for f in summary.json coordinator.log worker-0.log worker-1.log final/config.json admin.token join.token; do
  [[ -e "$RUN/$f" ]] || fail "missing $RUN/$f"
done
[[ "$(stat -c %a "$RUN/admin.token")" == 600 ]] || fail "admin.token is not 0600"
grep -q "$(cat "$RUN/admin.token")" "$RUN"/*.log && fail "a token appears in a log"
wait_until 10 no_leftovers "$RUN" || fail "processes left after success: $(leftovers "$RUN")"

# Ctrl-C mid-run: exit 3, every child gone.
RUN="$WORK/run-int"
"$TANDEMCTL" run --local --workers 2 --run-dir "$RUN" "$JOB" --set train.steps=100000 \
  >"$WORK/int.out" 2>&1 &
CTL=$!
wait_until 60 grep -q '"step"' "$RUN/metrics.jsonl" || { kill -KILL $CTL; fail "no step within 60 s"; }
[[ -n "$(leftovers "$RUN")" ]] || fail "children not found while running"
signal_and_wait INT $CTL
rc=${LAST_RCS[0]}
((rc == 3)) || { cat "$WORK/int.out"; fail "run --local after SIGINT exited $rc, want 3"; }
wait_until 10 no_leftovers "$RUN" || fail "processes left after SIGINT: $(leftovers "$RUN")"

# SIGKILL of tandemctl: the children die with it (death signal).
RUN="$WORK/run-kill"
"$TANDEMCTL" run --local --workers 2 --run-dir "$RUN" "$JOB" --set train.steps=100000 \
  >"$WORK/kill.out" 2>&1 &
CTL=$!
wait_until 60 grep -q '"step"' "$RUN/metrics.jsonl" || { kill -KILL $CTL; fail "no step within 60 s"; }
kill -KILL $CTL
wait $CTL 2>/dev/null || true
wait_until 10 no_leftovers "$RUN" || fail "processes left after SIGKILL: $(leftovers "$RUN")"

# Invalid job: exit 2 before anything starts.
expect_exit 2 "$TANDEMCTL" run --local --run-dir "$WORK/run-bad" "$JOB" --set train.steps=-1
expect_output "train.steps"
log "PASS"
