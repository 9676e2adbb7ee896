#!/usr/bin/env bash
# tandemctl run --local restarts a worker that dies during the job: with one
# worker SIGKILLed mid-run the job still succeeds, reports exactly one
# restart (reason: the signal) in summary.json and events.jsonl, and its
# final model is bit-identical to an uninterrupted run - restored from peer
# memory, and from disk with peer copies off. SIGKILL of tandemctl after a
# restart leaves no process behind (the restarted worker's death signal).
# With --no-restart the same kill fails the job with a clear message.
source "$(dirname "$0")/lib.sh"
JOB="$TI_DIR/../../configs/sft-arith-tiny.yaml"
# ~10 s per run on 2 idle cores; a checkpoint (and peer copy) every 50 steps.
# The kills land up to ~100 steps after their target on a busy machine
# (the /proc scan for the worker's pid), so each target leaves room before
# the end.
ARGS=(--workers 2 --set train.steps=400 --set checkpoint.every=50 --set checkpoint.keep=2)

leftovers() { pgrep -f -- "$1/" || true; }
show() { cat "$1" >&2 || ls -la "$WORK" >&2 || true; }
no_leftovers() { [[ -z "$(leftovers "$1")" ]]; }
last_step() { tail -n 1 "$1/metrics.jsonl" 2>/dev/null | sed -n 's/.*"step":\([0-9]*\).*/\1/p'; }
step_at_least() { local s; s=$(last_step "$1"); [[ -n "$s" ]] && ((s >= $2)); }
# json_get FILE PY_EXPR: evaluates PY_EXPR with d = the parsed JSON file.
json_get() { /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }
# events_of RUN KIND: the events.jsonl lines of that kind.
events_of() { grep -F "\"kind\":\"$2\"" "$1/events.jsonl" || true; }

# run_killing NAME KILL_AT_STEP [extra args]: a run whose local-1 gets SIGKILL
# once metrics.jsonl reaches the step; waits for tandemctl; sets RC.
run_killing() {
  local run="$WORK/$1" at=$2
  shift 2
  timeout 150 "$TANDEMCTL" run --local --run-dir "$run" "${ARGS[@]}" "$@" "$JOB" >"$WORK/$(basename "$run").out" 2>&1 &
  local ctl=$!
  wait_until 60 step_at_least "$run" "$at" || { kill -KILL $ctl; fail "$run: no step $at within 60 s"; }
  local victim
  victim=$(worker_pid local-1 "$run") || { kill -KILL $ctl; fail "$run: local-1 not found"; }
  log "$run: SIGKILL local-1 (pid $victim) at step $(last_step "$run")"
  kill -KILL "$victim"
  RC=0
  wait $ctl || RC=$?
}

# The reference: uninterrupted.
RUN="$WORK/ref"
T0=$(date +%s)
expect_exit 0 timeout 150 "$TANDEMCTL" run --local --run-dir "$RUN" "${ARGS[@]}" "$JOB"
REF=$(sha256sum "$RUN/final/model.safetensors" | cut -d' ' -f1)
[[ "$(json_get "$RUN/summary.json" 'len(d["worker_restarts"])')" == 0 ]] || fail "restarts in the reference run"
grep -q "^restarts" "$WORK/out.txt" && fail "the summary prints restarts without any"
log "reference run: $(($(date +%s) - T0)) s, model $REF"

# Killed mid-run, restored from peer memory; then from disk (no peer copies).
for variant in peer disk; do
  extra=()
  [[ $variant == disk ]] && extra=(--set recovery.no_peer_copies=true)
  at=$([[ $variant == peer ]] && echo 80 || echo 110)
  run_killing "kill-$variant" "$at" "${extra[@]}"
  RUN="$WORK/kill-$variant"
  OUT="$WORK/kill-$variant.out"
  ((RC == 0)) || { show "$OUT"; fail "$variant: run exited $RC after a worker was killed"; }
  grep -q "\[restart\] worker local-1 exited (signal 9: killed); restarted (1 of 5)" "$OUT" \
    || { show "$OUT"; fail "$variant: no restart progress line"; }
  grep -q "^restarts     1: local-1 (signal 9: killed)" "$OUT" || { show "$OUT"; fail "$variant: summary lacks restarts"; }
  [[ "$(json_get "$RUN/summary.json" 'd["state"]')" == SUCCEEDED ]] || fail "$variant: job did not succeed"
  [[ "$(json_get "$RUN/summary.json" 'len(d["worker_restarts"])')" == 1 ]] || fail "$variant: want exactly 1 restart"
  [[ "$(json_get "$RUN/summary.json" 'd["worker_restarts"][0]["worker"] + "/" + d["worker_restarts"][0]["reason"]')" \
      == "local-1/signal 9: killed" ]] || fail "$variant: wrong restart record: $(cat "$RUN/summary.json")"
  [[ "$(events_of "$RUN" restart | wc -l)" == 1 ]] || fail "$variant: events.jsonl: want 1 restart line"
  events_of "$RUN" restart | grep -q '"reason":"signal 9: killed"' || fail "$variant: restart event lacks the reason"
  [[ -z "$(events_of "$RUN" restart_limit)$(events_of "$RUN" worker_exit)" ]] || fail "$variant: unexpected exit events"
  grep -q "restoring step .* from $([[ $variant == peer ]] && echo 'peer memory' || echo disk)" "$RUN/events.jsonl" \
    || { show "$RUN/events.jsonl"; fail "$variant: recovery did not restore from $variant"; }
  # The restarted worker appended to the same log.
  [[ "$(grep -c "effective config" "$RUN/worker-1.log")" == 2 ]] || fail "$variant: worker-1.log not appended"
  GOT=$(sha256sum "$RUN/final/model.safetensors" | cut -d' ' -f1)
  [[ "$GOT" == "$REF" ]] || fail "$variant: final model differs from the uninterrupted run ($GOT vs $REF)"
  wait_until 10 no_leftovers "$RUN" || fail "$variant: processes left: $(leftovers "$RUN")"
  log "$variant: restarted, recovered, bit-identical"
done

# SIGKILL of tandemctl after a restart: the restarted worker dies with it.
RUN="$WORK/kill-ctl"
"$TANDEMCTL" run --local --run-dir "$RUN" "${ARGS[@]}" --set train.steps=100000 "$JOB" >"$WORK/kill-ctl.out" 2>&1 &
CTL=$!
wait_until 60 step_at_least "$RUN" 20 || { kill -KILL $CTL; fail "kill-ctl: no progress"; }
OLD=$(worker_pid local-1 "$RUN") || { kill -KILL $CTL; fail "kill-ctl: local-1 not found"; }
kill -KILL "$OLD"
restarted() { [[ -n "$(events_of "$RUN" restart)" ]]; }
wait_until 30 restarted || { kill -KILL $CTL; fail "kill-ctl: no restart"; }
NEW=$(worker_pid local-1 "$RUN") || { kill -KILL $CTL; fail "kill-ctl: restarted local-1 not found"; }
[[ "$NEW" != "$OLD" ]] || { kill -KILL $CTL; fail "kill-ctl: same pid after restart"; }
kill -KILL $CTL
wait $CTL 2>/dev/null || true
wait_until 10 no_leftovers "$RUN" || fail "processes left after SIGKILL of tandemctl: $(leftovers "$RUN")"
log "kill-ctl: restarted worker $NEW gone with tandemctl"

# --no-restart: the job waits for a replacement (3 s here), then fails.
run_killing no-restart 80 --no-restart --set recovery.replacement_timeout_ms=3000
RUN="$WORK/no-restart"
OUT="$WORK/no-restart.out"
((RC == 1)) || { show "$OUT"; fail "--no-restart: run exited $RC, want 1"; }
grep -q "worker local-1 exited (signal 9: killed); not restarted (--no-restart)" "$OUT" \
  || { show "$OUT"; fail "--no-restart: no clear exit message"; }
grep -q "FAILED.*no replacement worker" "$OUT" || { show "$OUT"; fail "--no-restart: job did not fail for want of a worker"; }
[[ "$(json_get "$RUN/summary.json" 'len(d["worker_restarts"])')" == 0 ]] || fail "--no-restart: a restart happened"
[[ "$(json_get "$RUN/summary.json" 'd["workers_not_restarted"][0]["why"]')" == *"--no-restart"* ]] \
  || fail "--no-restart: summary lacks workers_not_restarted"
[[ "$(events_of "$RUN" worker_exit | wc -l)" == 1 ]] || fail "--no-restart: events.jsonl: want 1 worker_exit line"
wait_until 10 no_leftovers "$RUN" || fail "--no-restart: processes left: $(leftovers "$RUN")"
log "PASS in $(($(date +%s) - T0)) s"
