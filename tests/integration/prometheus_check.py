#!/usr/bin/env python3
"""Asks a Prometheus that scraped a Tandem coordinator for every series an
operator needs; each check is a PromQL query that must return a non-empty
vector. Then checks that a Grafana dashboard is valid JSON whose queries
use only metric names this Prometheus holds.

usage: prometheus_check.py PROMETHEUS_URL STEPS DASHBOARD_JSON
Waits (bounded: 60 s) for the checks to pass, as scrapes arrive each second.
"""
import json
import re
import sys
import time
import urllib.parse
import urllib.request


def query(base, expr):
    url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def checks(steps):
    return [
        ("the scrape target is up", 'up{job="tandem"} == 1'),
        ("jobs by state", 'tandem_jobs{state="succeeded"} >= 1'),
        ("jobs by state (every state exported)", "count(tandem_jobs) >= 6"),
        ("workers by state", "sum(tandem_workers) >= 3"),
        ("workers by state (the killed one)", 'tandem_workers{state=~"lost|gone"} >= 1'),
        ("steps", f'tandem_steps_total{{kind="sft"}} >= {steps}'),
        ("step rate", 'max_over_time(rate(tandem_steps_total{kind="sft"}[5s])[5m:1s]) > 0'),
        ("per-phase seconds", f'tandem_phase_duration_seconds_count{{phase="sft_step"}} >= {steps}'),
        ("per-phase seconds (setup again after the recovery)",
         'tandem_phase_duration_seconds_count{phase="setup"} >= 2'),
        ("per-phase latency quantile",
         'histogram_quantile(0.9, sum by (le) (increase(tandem_phase_duration_seconds_bucket{phase="sft_step"}[5m]))) > 0'),
        ("recoveries", "tandem_recoveries_total >= 1"),
        ("checkpoints", "tandem_checkpoints_total >= 1"),
        ("checkpoint bytes", "tandem_checkpoint_bytes_total > 0"),
        ("checkpoint duration", "tandem_checkpoint_duration_seconds_count >= 1"),
        ("checkpoint duration sum", "tandem_checkpoint_duration_seconds_sum > 0"),
        ("collective bytes per kind", "sum(tandem_collective_sent_bytes_total) > 0"),
        ("collective bytes: every kind exported", "count(tandem_collective_sent_bytes_total) == 8"),
        ("RPC latency histogram",
         'tandem_grpc_server_handling_seconds_count{grpc_service="tandem.v1.Cluster",grpc_method="ReportPhase"} > 0'),
        ("RPC latency buckets",
         'tandem_grpc_server_handling_seconds_bucket{grpc_method="Heartbeat",le="+Inf"} > 0'),
        ("the running job's gauges", 'last_over_time(tandem_job_loss{name="prometheus-run"}[5m]) > 0'),
        ("the running job's phase seconds", 'last_over_time(tandem_job_phase_seconds{phase="sft_step"}[5m]) > 0'),
        ("the running job's step", 'last_over_time(tandem_job_step{name="prometheus-run"}[5m]) >= 4'),
        ("RPCs by code", 'tandem_grpc_server_handled_total{grpc_method="SubmitJob",grpc_code="OK"} >= 1'),
    ]


def main():
    base, steps, dashboard_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    failing = []
    deadline = time.monotonic() + 60
    for _ in range(120):
        failing = []
        for what, expr in checks(steps):
            try:
                if not query(base, expr):
                    failing.append((what, expr, "empty result"))
            except Exception as e:  # a transient HTTP error counts as a failed check
                failing.append((what, expr, str(e)))
        if not failing or time.monotonic() > deadline:
            break
        time.sleep(1)
    for what, expr, why in failing:
        print(f"prometheus_check: {what}: {expr}: {why}", file=sys.stderr)
    for what, expr in checks(steps):
        if all(f[1] != expr for f in failing):
            print(f"ok  {what}: {expr}", file=sys.stderr)

    # The dashboard: valid JSON, every query's metric names held by Prometheus.
    with urllib.request.urlopen(base + "/api/v1/label/__name__/values", timeout=5) as r:
        names = set(json.load(r)["data"])
    with open(dashboard_path) as f:
        dashboard = json.load(f)
    exprs = []

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "expr" and isinstance(v, str):
                    exprs.append(v)
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(dashboard)
    bad_dashboard = False
    if len(exprs) < 8:
        print(f"prometheus_check: dashboard has only {len(exprs)} queries", file=sys.stderr)
        bad_dashboard = True
    used = set()
    for e in exprs:
        used.update(re.findall(r"\b(tandem_[a-z0-9_]+)", e))
    for name in sorted(used):
        if name not in names:
            print(f"prometheus_check: dashboard uses {name}, which Prometheus does not hold", file=sys.stderr)
            bad_dashboard = True
    print(f"dashboard: {len(exprs)} queries over {len(used)} series, all held by Prometheus"
          if not bad_dashboard else "dashboard: FAIL", file=sys.stderr)
    sys.exit(1 if failing or bad_dashboard else 0)


if __name__ == "__main__":
    main()
