#!/usr/bin/env bash
# Debian's real Prometheus scrapes the coordinator's /metrics every second
# while a 2-worker SFT job runs, checkpoints, loses a worker (SIGKILL),
# recovers onto a spare and finishes. Then the Prometheus HTTP API must
# return every series an operator needs (prometheus_check.py lists them with
# the value each must reach), `promtool check metrics` must pass on a
# scrape, and deploy/grafana/tandem.json must be valid JSON that uses only
# series this Prometheus holds. Prometheus runs from a generated config in
# the test's temporary directory (its storage too) and is stopped by PID.
source "$(dirname "$0")/lib.sh"
require_program prometheus prometheus
require_program promtool prometheus
JOB="$TI_DIR/jobs/sft-tiny.yaml"
STEPS=300

start_coordinator --lease-ms 2000 --heartbeat-ms 250 --set reattach_grace_ms=1000 \
  --set replacement_timeout_ms=20000
for name in a b c; do
  start_worker "$name"
done
wait_until 30 workers_idle_at_least 3 || fail "workers did not register"

# Prometheus on a free loopback port (it cannot report an ephemeral one):
# ask the kernel for one, retry on the rare race with another process.
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
cat >"$WORK/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: tandem
    static_configs:
      - targets: ['$METRICS_ADDR']
YML
promtool check config "$WORK/prometheus.yml" >&2 || fail "promtool rejects the generated config"
PROM_ADDR=""
for attempt in 1 2 3; do
  port=$(free_port)
  setsid prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/prometheus-data" \
    --web.listen-address="127.0.0.1:$port" --log.level=warn >>"$WORK/prometheus.log" 2>&1 &
  PROM_PID=$!
  STARTED_PIDS+=("$PROM_PID")
  if wait_until 30 curl -sf --max-time 2 "http://127.0.0.1:$port/-/ready"; then
    PROM_ADDR="127.0.0.1:$port"
    break
  fi
  kill -TERM "$PROM_PID" 2>/dev/null || true
  log "prometheus did not come up on port $port (attempt $attempt)"
done
[[ -n "$PROM_ADDR" ]] || { tail -n 20 "$WORK/prometheus.log" >&2; fail "prometheus did not start"; }
log "prometheus pid $PROM_PID on $PROM_ADDR"
# prom_has QUERY: Prometheus answers QUERY with a non-empty vector.
prom_has() {
  curl -sf --max-time 3 "http://$PROM_ADDR/api/v1/query" --data-urlencode "query=$1" |
    /usr/bin/python3 -c 'import json, sys; sys.exit(0 if json.load(sys.stdin)["data"]["result"] else 1)'
}
# A scrape before the job, so that increases and rates start from 0.
wait_until 30 prom_has 'tandem_steps_total{kind="sft"} == 0' || fail "prometheus did not scrape the coordinator"

ID=$(ctl submit "$JOB" --workers 2 --set name=prometheus-run --set train.steps=$STEPS \
  --set checkpoint.every=2 --set checkpoint.keep=2)
follow_job run "$ID"
wait_until 120 step_at_least run 4 || fail "job made no progress"
# A scrape of the running job's gauges, then kill one of its workers: the
# job recovers onto the spare.
wait_until 30 prom_has 'tandem_job_step{name="prometheus-run"}' || fail "no scrape of the running job"
VICTIM=$(ctl workers --output json | /usr/bin/python3 -c '
import json, sys
for line in sys.stdin:
    w = json.loads(line) if line.strip() else {}
    if w.get("state") == "WORKER_STATE_BUSY":
        print(w["name"]); break')
[[ -n "$VICTIM" ]] || fail "no busy worker to kill"
log "killing worker $VICTIM (pid $(member_pid "$VICTIM"))"
kill_member KILL "$VICTIM"
wait "$FOLLOW_PID" || fail "job did not succeed: $(job_state "$ID")"
event_seen run "recovered in" || { job_events run >&2; fail "no recovery event"; }

curl -sf --max-time 5 "http://$METRICS_ADDR/metrics" >"$WORK/scrape.txt" || fail "cannot scrape /metrics"
promtool check metrics <"$WORK/scrape.txt" >"$WORK/promtool.txt" 2>&1 \
  || { cat "$WORK/promtool.txt" >&2; fail "promtool check metrics failed"; }

# Every series, through Prometheus (the checker waits, bounded, for the
# scrapes after the job's end to arrive).
timeout 90 /usr/bin/python3 "$TI_DIR/prometheus_check.py" "http://$PROM_ADDR" "$STEPS" \
  "$TI_DIR/../../deploy/grafana/tandem.json" || fail "Prometheus lacks series (see above)"
log "PASS"
