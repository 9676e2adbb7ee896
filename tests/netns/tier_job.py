#!/usr/bin/python3
"""Runs one Tandem job on emulated tiers (netns.Tiers): a coordinator in
the run's coordinator namespace and `per_node` workers in each node's
namespace (`--node nodeK`), started through tests/support/cluster.py.

run_job() is called outside the namespaces; it runs this file again inside
the coordinator namespace (`ip netns exec`), where the coordinator's
address is reachable, and that process starts the cluster, submits the job,
waits for it to end (bounded), stops the cluster and prints the job and
its events as JSON. Standard library only.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, HERE)
import cluster  # noqa: E402
import netns  # noqa: E402


class JobError(RuntimeError):
    """The job did not run to its end, or its run could not be read."""


def run_job(tiers, bindir, spec_path, per_node, root, timeout=300):
    """{"job": Job as JSON, "events": [...]} of the job in spec_path, run on
    tiers.nodes x per_node workers. Raises JobError with the inner run's
    output when it fails."""
    argv = [*tiers.exec_prefix(tiers.coord_ns), sys.executable, os.path.abspath(__file__), "--bin", bindir,
            "--root", root, "--spec", spec_path, "--per-node", str(per_node), "--timeout", str(timeout)]
    for k in range(tiers.nodes):
        argv += ["--node-ns", tiers.node_ns(k), "--node-addr", tiers.node_addr(k)]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 60)
    except subprocess.TimeoutExpired as e:
        raise JobError(f"the job run did not end in {timeout + 60} s: {e.stderr}") from None
    if r.returncode != 0:
        raise JobError(f"the job run failed ({r.returncode}): {r.stderr[-4000:]}")
    return json.loads(r.stdout)


def step_metrics(events):
    """The metrics of the job's "step" events, in step order."""
    steps = [e.get("metrics") or {} for e in events if e.get("kind") == "step"]
    return sorted(steps, key=lambda m: int(m.get("step", 0)))


def _inner(args):
    c = cluster.Cluster(args.root, bins=cluster.default_bins(args.bin), host=netns.COORD_ADDR)
    try:
        # The network is the run's own namespaces: no TLS on it.
        c.start_coordinator(["--insecure"], timeout=30)
        names = []
        for k, (ns, addr) in enumerate(zip(args.node_ns, args.node_addr)):
            for j in range(args.per_node):
                name = f"n{k}w{j}"
                c.start_worker(name, ["--node", f"node{k}"], prefix=["ip", "netns", "exec", ns], data_address=addr)
                names.append(name)
        c.wait_workers(names, timeout=60)
        r = c.ctl("submit", args.spec, "--output", "json")
        if r.returncode != 0:
            sys.exit(f"submit failed: {r.stdout} {r.stderr}")
        first = json.loads(r.stdout.strip().splitlines()[0])
        job_id = first.get("job_id") or first.get("jobId")
        last = {}

        def ended():
            jobs = c.ctl_json("status", job_id)
            last["job"] = jobs[0] if jobs else {}
            state = last["job"].get("state", "")
            return last["job"] if state in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED") else None

        try:
            job = cluster.wait_for(ended, args.timeout, f"job {job_id} to end", interval=0.2)
        except cluster.ClusterError as e:
            sys.exit(f"{e}: {last.get('job')}")
        ev = c.ctl("--output", "json", "events", job_id, timeout=60)
        if ev.returncode != 0:
            sys.exit(f"tandemctl events failed: {ev.stderr}")
        events = [json.loads(line) for line in ev.stdout.splitlines() if line.strip()]
        print(json.dumps({"job": job, "events": events}))
    finally:
        c.down()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--root", default=None)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--per-node", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--node-ns", action="append", default=[])
    ap.add_argument("--node-addr", action="append", default=[])
    args = ap.parse_args()
    if not args.root:
        args.root = tempfile.mkdtemp(prefix="tier-job-")
    _inner(args)


if __name__ == "__main__":
    main()
