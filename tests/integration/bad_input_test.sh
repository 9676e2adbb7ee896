#!/usr/bin/env bash
# Bad input through tandemctl and raw clients: malformed YAML, unknown keys,
# wrong types, negative/zero sizes, absurd values, megabyte strings, missing
# files, missing/wrong tokens, a worker token on Control, a worker
# registering twice under one name, and clients dropping streams mid-way.
# Each gets a clear error (exit code + message naming the field) and the
# coordinator stays healthy (checked after each).
source "$(dirname "$0")/lib.sh"
JOB="$TI_DIR/jobs/sft-tiny.yaml"
start_coordinator
healthy

bad() {  # bad NAME EXPECTED_TEXT < yaml on stdin: validate and submit both reject it
  local name=$1 text=$2
  cat >"$WORK/$name.yaml"
  expect_exit 2 "$TANDEMCTL" validate "$WORK/$name.yaml"
  expect_output "$text"
  expect_exit 2 ctl submit "$WORK/$name.yaml"
  expect_output "$text"
  healthy
}
printf 'name: x\nkind: sft\ntrain: {steps: 3\n' | bad malformed "line"
{ cat "$JOB"; echo "bogus_key: 1"; } | bad unknown-top "bogus_key"
sed 's/steps: 4/stepz: 4/' "$JOB" | bad unknown-nested "train.stepz"
sed 's/steps: 4/steps: abc/' "$JOB" | bad wrong-type "train.steps"
sed 's/steps: 4/steps: -3/' "$JOB" | bad negative "train.steps"
sed 's/global_batch: 8/global_batch: 0/' "$JOB" | bad zero "train.global_batch"
sed 's/steps: 4/steps: 99999999999999/' "$JOB" | bad absurd "train.steps"
sed 's/workers: 1,/workers: 100000000,/' "$JOB" | bad absurd-workers "cluster.workers"
{ sed '/^name:/d' "$JOB"; printf 'name: %s\n' "$(head -c 2000000 /dev/zero | tr '\0' a)"; } | bad megabyte "name"
# Valid YAML that every worker would refuse: the workers' model limits apply.
sed 's/vocab_size: 99/vocab_size: 50/' "$JOB" | bad char-vocab "with the char tokenizer"
sed 's/    max_position_embeddings: 64/    max_position_embeddings: 64\n    rope_scaling: {rope_type: linear, factor: 2000}/' "$JOB" |
  bad rope-factor "rope_scaling.factor"
{ cat "$JOB"; echo "recovery: {max_recoveries: -1}"; } | bad negative-recovery "recovery.max_recoveries"
expect_exit 2 "$TANDEMCTL" validate "$WORK/no-such-file.yaml"
expect_output "no-such-file"
expect_exit 2 ctl submit "$JOB" --set train.nope=1
expect_output "train.nope"
expect_exit 2 ctl submit "$JOB" --workers abc
expect_output "workers"
expect_exit 2 ctl submit
expect_exit 2 ctl frobnicate
expect_exit 2 ctl jobs --bogus-flag
expect_output "bogus-flag"
healthy

# Authentication: none, wrong, the join token on Control, a missing token file.
expect_exit 5 "$TANDEMCTL" --coordinator "$GRPC_ADDR" jobs
expect_output "UNAUTHENTICATED\|token"
echo wrong-token >"$WORK/wrong.token"
expect_exit 5 "$TANDEMCTL" --coordinator "$GRPC_ADDR" --token-file "$WORK/wrong.token" workers
expect_exit 5 "$TANDEMCTL" --coordinator "$GRPC_ADDR" --token-file "$WORK/join.token" jobs
expect_exit 2 "$TANDEMCTL" --coordinator "$GRPC_ADDR" --token-file "$WORK/missing.token" jobs
healthy
# Plaintext on an address other machines reach needs --insecure (or TLS).
expect_exit 2 timeout 30 "$TANDEM_COORDINATOR_BIN" --listen 0.0.0.0:0 --metrics-listen "" \
  --state-dir "$WORK/plain-state" --admin-token-file "$WORK/admin.token"
expect_output "cross the network in plaintext"
# Token files readable by others and admin == join are warned about.
cp "$WORK/admin.token" "$WORK/loose.token"
chmod 644 "$WORK/loose.token"
timeout 30 "$TANDEM_COORDINATOR_BIN" --listen 127.0.0.1:0 --metrics-listen "" --state-dir "$WORK/loose-state" \
  --admin-token-file "$WORK/loose.token" --join-token-file "$WORK/loose.token" >"$WORK/loose.log" 2>&1 &
LOOSE=$!
wait_until 30 grep -q "listening" "$WORK/loose.log" || fail "coordinator with loose tokens did not start"
grep -q "is readable by everyone (mode 0644): chmod 600" "$WORK/loose.log" || fail "no warning about the token file mode"
grep -q "admin token equals the join token" "$WORK/loose.log" || fail "no warning about admin == join"
kill -TERM "$LOOSE"; wait "$LOOSE" || true
# Unreachable coordinator: exit 4.
expect_exit 4 "$TANDEMCTL" --coordinator 127.0.0.1:1 --token-file "$WORK/admin.token" jobs
# A worker with a wrong join token is refused and exits (5), the daemon lives.
echo nope >"$WORK/bad-join.token"
expect_exit 5 timeout 30 "$TANDEM_WORKER_BIN" --coordinator "$GRPC_ADDR" --name badtok \
  --token-file "$WORK/bad-join.token"
healthy

# The same worker name started twice: the first keeps its identity (never
# traded back and forth), the second is refused with a clear error.
start_worker twin
wait_until 30 workers_idle_at_least 1 || fail "worker did not register"
twin_id() { ctl workers --output json | grep -o '"id":"w-[0-9]*","name":"twin"' | head -1; }
ID_BEFORE=$(twin_id)
[[ -n $ID_BEFORE ]] || { ctl workers --output json; fail "twin not listed"; }
REFUSED=(tandem_grpc_server_handled_total 'grpc_method="RegisterWorker"' 'grpc_code="ALREADY_EXISTS"')
REFUSED_BEFORE=$(metric_sum "${REFUSED[@]}")
start_worker twin-again --name twin   # the launcher's member twin-again, a worker named twin
# The second twin retries: once the coordinator has refused it three times
# (its RegisterWorker calls counted in /metrics), the first still holds the name.
wait_until 60 metric_above "${REFUSED[0]}" $((REFUSED_BEFORE + 2)) "${REFUSED[@]:1}" ||
  fail "the second twin was not refused 3 times: $(metric_sum "${REFUSED[@]}") refusals"
grep -q "is held by live worker" "$WORK/worker-twin-again.log" || fail "second twin not refused clearly"
n=$(ctl workers --output json | grep -c '"name":"twin"' || true)
((n == 1)) || { ctl workers; fail "name 'twin' listed $n times"; }
[[ $(twin_id) == "$ID_BEFORE" ]] || fail "twin identity changed: $ID_BEFORE -> $(twin_id)"
kill_member TERM twin-again
kill_member TERM twin
healthy

# A job too large for its worker. Submitted while no worker is there to
# compare with, it runs and its phase fails with "out of memory" (the worker
# catches the failed allocation and lives). Once the worker has registered
# (reporting its RLIMIT_AS as usable memory), the same job is refused at
# submission with the estimate.
sed -e 's/hidden_size: 32/hidden_size: 2048/' -e 's/intermediate_size: 64/intermediate_size: 8192/' \
  -e 's/num_hidden_layers: 2/num_hidden_layers: 12/' -e 's/num_attention_heads: 4/num_attention_heads: 16/' \
  -e 's/num_key_value_heads: 2/num_key_value_heads: 16/' "$JOB" >"$WORK/big.yaml"
wait_until 30 sh -c "! '$TANDEMCTL' --coordinator '$GRPC_ADDR' --token-file '$WORK/admin.token' workers | grep -q IDLE" ||
  fail "workers still idle"
BIG=$(ctl submit "$WORK/big.yaml" --set name=too-big)
cluster start-worker small --rlimit-as 3072000000 >/dev/null || fail "worker small did not start"
wait_until 120 sh -c "'$TANDEMCTL' --coordinator '$GRPC_ADDR' --token-file '$WORK/admin.token' status '$BIG' | grep -q FAILED" ||
  { ctl status "$BIG"; fail "too-big job did not fail"; }
ctl status "$BIG" >"$WORK/out.txt" 2>&1 || true
expect_output "out of memory in PHASE_SETUP"
[[ $(cluster exit-code small) == running ]] || fail "the memory-limited worker died instead of reporting"
# Its log says before the SETUP that the job does not fit (the last line a
# worker the kernel's OOM killer ends would leave).
grep -q "needs about .* on this worker (estimate for 1 rank(s)), more than the [0-9]* MiB it can use" \
  "$WORK/worker-small.log" || { tail -5 "$WORK/worker-small.log"; fail "no memory warning in the worker's log"; }
# The memory the worker reports: its RLIMIT_AS, or less where the
# machine's cgroup allows less.
SMALL_BYTES=$(ctl workers --output json | grep -o '"name":"small"[^}]*' | grep -o '"memory_bytes":"[0-9]*"' |
  grep -o '[0-9][0-9]*' | head -1)
[[ -n $SMALL_BYTES ]] || { ctl workers --output json; fail "worker 'small' reports no memory"; }
SMALL_GIB=$(awk -v b="$SMALL_BYTES" 'BEGIN { printf "%.1f GiB", b / 1073741824 }')
expect_exit 1 ctl submit "$WORK/big.yaml" --set name=too-big-again
expect_output "the largest cpu worker has $SMALL_GIB"
kill_member TERM small
healthy

# Clients that drop streams mid-way: watch and logs -f killed while streaming.
ID=$(ctl submit "$JOB" --workers 4 --set name=stream-drop)   # stays PENDING (1 worker)
LOG_CALLS=(tandem_grpc_server_handled_total 'grpc_method="GetJobLogs"')
for sig in INT KILL; do
  before=$(metric_sum "${LOG_CALLS[@]}")
  "$TANDEMCTL" --coordinator "$GRPC_ADDR" --token-file "$WORK/admin.token" watch "$ID" >"$WORK/drop-$sig.txt" 2>&1 &
  W=$!
  "$TANDEMCTL" --coordinator "$GRPC_ADDR" --token-file "$WORK/admin.token" logs -f "$ID" >/dev/null 2>&1 &
  L=$!
  # Both are streaming: watch has printed the job's snapshot, logs -f has
  # polled (its GetJobLogs calls are counted in /metrics).
  wait_until 30 test -s "$WORK/drop-$sig.txt" || fail "watch printed nothing"
  wait_until 30 metric_above "${LOG_CALLS[0]}" "$before" "${LOG_CALLS[1]}" || fail "logs -f made no call"
  signal_and_wait "$sig" $W $L
  healthy
done
expect_exit 0 ctl cancel "$ID"
healthy
log "PASS"
