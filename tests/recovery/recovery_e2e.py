#!/usr/bin/python3
"""Recovery with real processes on 127.0.0.1 (issue 6), bounded.

Starts build/bin/tandem-coordinator and tandem-worker processes (a local
supervisor restarts a worker that dies, as systemd or Kubernetes would), runs
a tiny SFT job once without faults for the reference weights, then once per
scenario with faults, and compares the sha256 of the exported safetensors:

  kill-worker      kill -9 a busy worker mid-run (restarted by the supervisor)
  kill-spare       kill -9 a busy worker; an idle spare replaces it
  kill-coordinator kill -9 the coordinator mid-run; restart it on the same state dir
  sigterm          SIGTERM a busy worker (graceful preemption, if the daemon
                   sends Heartbeat.preempting)
  chaos            several kills of random busy workers and one coordinator kill

Prints one line per recovery ("recovered in ...") and, for chaos, the median and
max recovery time and the steps redone. Exit 0 when every scenario finished
with weights identical to the reference.

  tests/recovery/recovery_e2e.py --bin build/bin [--scenarios kill-worker,chaos]
"""
import argparse
import glob
import hashlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

TOKEN = "e2e-recovery-token"

JOB = """
name: recovery-e2e
kind: sft
seed: 7
model:
  config:
    vocab_size: 99
    hidden_size: 48
    intermediate_size: 96
    num_hidden_layers: 2
    num_attention_heads: 4
    num_key_value_heads: 2
    max_position_embeddings: 32
    tokenizer: char
    bos_token_id: 1
    eos_token_id: 2
    pad_token_id: 0
task: {{name: arithmetic, op: add, digits: 2, eval_size: 16}}
train: {{steps: {steps}, lr: 3.0e-3, global_batch: 16, micro_batch: 4, warmup_steps: 2, seq_len: 16}}
cluster: {{workers: {workers}, zero_stage: 2, threads_per_worker: 1}}
checkpoint: {{every: {every}, keep: 3}}
recovery: {{replacement_timeout_ms: 30000}}
output_dir: {out}
"""


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


class Cluster:
    def __init__(self, bindir, root, workers, spares):
        self.bin = bindir
        self.root = root
        self.port = None
        self.coord = None
        self.stop = False
        self.workers = {}  # name -> Popen
        self.restart = {}  # name -> bool (supervised)
        self.lock = threading.Lock()
        with open(os.path.join(root, "token"), "w") as f:
            f.write(TOKEN + "\n")
        self.start_coordinator()
        for i in range(workers + spares):
            self.start_worker(f"w{i}")
        self.sup = threading.Thread(target=self.supervise, daemon=True)
        self.sup.start()

    def start_coordinator(self):
        listen = f"127.0.0.1:{self.port or 0}"
        logf = open(os.path.join(self.root, "coordinator.log"), "a")
        self.coord = subprocess.Popen(
            [os.path.join(self.bin, "tandem-coordinator"), "--listen", listen, "--metrics-listen", "",
             "--state-dir", os.path.join(self.root, "state"), "--admin-token-file", os.path.join(self.root, "token"),
             "--join-token-file", os.path.join(self.root, "token"), "--lease-ms", "2000", "--heartbeat-ms", "250",
             "--set", "replacement_timeout_ms=30000"],
            stdout=subprocess.PIPE, stderr=logf, text=True)
        deadline = time.time() + 20
        while time.time() < deadline:
            line = self.coord.stdout.readline()
            m = re.search(r"grpc=([\d.]+):(\d+)", line or "")
            if m:
                self.port = int(m.group(2))
                threading.Thread(target=self.coord.stdout.read, daemon=True).start()
                return
            if self.coord.poll() is not None:
                break
        raise RuntimeError("coordinator did not start; see coordinator.log")

    def start_worker(self, name):
        logf = open(os.path.join(self.root, f"{name}.log"), "a")
        p = subprocess.Popen(
            [os.path.join(self.bin, "tandem-worker"), "--coordinator", f"127.0.0.1:{self.port}", "--name", name,
             "--threads", "1", "--token-file", os.path.join(self.root, "token"), "--data-address", "127.0.0.1"],
            stdout=logf, stderr=logf)
        with self.lock:
            self.workers[name] = p
            self.restart[name] = True

    def supervise(self):
        while not self.stop:
            time.sleep(0.2)
            with self.lock:
                dead = [n for n, p in self.workers.items() if p.poll() is not None and self.restart[n]]
            for n in dead:
                if not self.stop:
                    self.start_worker(n)

    def ctl(self, *args, timeout=30):
        r = subprocess.run([os.path.join(self.bin, "tandemctl"), "--coordinator", f"127.0.0.1:{self.port}",
                            "--token-file", os.path.join(self.root, "token"), *args],
                           capture_output=True, text=True, timeout=timeout)
        return r

    def job(self, job_id):
        r = self.ctl("status", job_id, "--output", "json")
        if r.returncode not in (0, 1, 2, 3, 4, 5) or not r.stdout.strip():
            return None
        try:
            return json.loads(r.stdout.strip().splitlines()[0])
        except json.JSONDecodeError:
            return None

    def workers_json(self):
        r = self.ctl("workers", "--output", "json")
        out = []
        for line in r.stdout.splitlines():
            try:
                d = json.loads(line)
                out.extend(d.get("workers", []) if "workers" in d else [d])
            except json.JSONDecodeError:
                pass
        return out

    def close(self):
        self.stop = True
        with self.lock:
            procs = list(self.workers.values())
        for p in procs + [self.coord]:
            if p and p.poll() is None:
                p.terminate()
        for p in procs + [self.coord]:
            if p:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def state_of(job):
    s = (job or {}).get("state", "")
    return s.replace("JOB_STATE_", "").lower()


def step_of(job):
    return int((job or {}).get("step", 0) or 0)


def submit(cluster, spec_path):
    r = cluster.ctl("submit", spec_path, "--output", "json")
    if r.returncode != 0:
        raise RuntimeError(f"submit failed: {r.stdout} {r.stderr}")
    d = json.loads(r.stdout.strip().splitlines()[0])
    return d.get("job_id") or d.get("jobId")


def wait(cluster, job_id, pred, limit):
    deadline = time.time() + limit
    job = None
    while time.time() < deadline:
        try:
            job = cluster.job(job_id)
        except Exception:  # coordinator restarting
            job = None
        if job and pred(job):
            return job
        time.sleep(0.1)
    raise RuntimeError(f"timed out after {limit}s waiting on {job_id}: {job}")


def weights_sha(out):
    files = sorted(glob.glob(os.path.join(out, "*.safetensors")))
    if not files:
        raise RuntimeError(f"no safetensors in {out}")
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()


def recoveries(cluster, job_id):
    r = cluster.ctl("logs", job_id)
    out = []
    for line in r.stdout.splitlines():
        m = re.search(r"recovered in ([\d.]+) s: detect ([\d.]+) s, wait ([\d.]+) s, rendezvous ([\d.]+) s, "
                      r"restore ([\d.]+) s from (\S+ ?\S*); resuming at step (\d+) \((\d+) steps? redone\)", line)
        if m:
            out.append({"total": float(m.group(1)), "detect": float(m.group(2)), "wait": float(m.group(3)),
                        "rendezvous": float(m.group(4)), "restore": float(m.group(5)), "from": m.group(6),
                        "redone": int(m.group(8)), "line": line.strip()})
    return out


def busy_workers(cluster, job_id):
    return [w.get("name") for w in cluster.workers_json()
            if (w.get("job_id") or w.get("jobId")) == job_id]


def run_job(cluster, root, tag, args, fault=None):
    out = os.path.join(root, f"final-{tag}")
    spec = os.path.join(root, f"{tag}.yaml")
    with open(spec, "w") as f:
        f.write(JOB.format(steps=args.steps, workers=args.workers, every=args.every, out=out))
    job_id = submit(cluster, spec)
    t0 = time.time()
    if fault:
        fault(cluster, job_id)
    job = wait(cluster, job_id, lambda j: state_of(j) in ("succeeded", "failed", "cancelled"), args.limit)
    if state_of(job) != "succeeded":
        raise RuntimeError(f"{tag}: job {job_id} ended {state_of(job)}: {job.get('reason')}")
    return job_id, weights_sha(out), time.time() - t0


def kill_busy(cluster, job_id, rng, at_step, sig=signal.SIGKILL, restart=True):
    wait(cluster, job_id, lambda j: step_of(j) >= at_step and state_of(j) == "running", 120)
    names = busy_workers(cluster, job_id)
    if not names:
        raise RuntimeError("no busy worker to kill")
    name = rng.choice(names)
    with cluster.lock:
        p = cluster.workers[name]
        cluster.restart[name] = restart
    log(f"  {signal.Signals(sig).name} worker {name} (pid {p.pid}) at step {step_of(cluster.job(job_id))}")
    p.send_signal(sig)
    return name


def kill_coordinator(cluster, job_id, at_step):
    wait(cluster, job_id, lambda j: step_of(j) >= at_step and state_of(j) == "running", 120)
    log(f"  SIGKILL coordinator (pid {cluster.coord.pid}) at step {step_of(cluster.job(job_id))}")
    cluster.coord.kill()
    cluster.coord.wait()
    time.sleep(0.5)
    cluster.start_coordinator()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--scenarios", default="kill-worker,kill-spare,kill-coordinator,sigterm,chaos")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--limit", type=int, default=240, help="seconds per job")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the run directory")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    root = tempfile.mkdtemp(prefix="tandem-recovery-e2e-")
    log("run dir", root)
    failures = 0
    cluster = Cluster(os.path.abspath(args.bin), root, args.workers, spares=1)
    try:
        time.sleep(1.0)
        ref_id, ref_sha, ref_s = run_job(cluster, root, "reference", args)
        log(f"reference {ref_id}: {ref_s:.1f} s, weights sha256 {ref_sha[:16]}")
        all_rec = []
        for sc in [s for s in args.scenarios.split(",") if s]:
            if sc == "kill-worker":
                fault = lambda c, j: kill_busy(c, j, rng, args.steps // 2)
            elif sc == "kill-spare":
                fault = lambda c, j: kill_busy(c, j, rng, args.steps // 2, restart=False)
            elif sc == "kill-coordinator":
                fault = lambda c, j: kill_coordinator(c, j, args.steps // 2)
            elif sc == "sigterm":
                fault = lambda c, j: kill_busy(c, j, rng, args.steps // 2, sig=signal.SIGTERM)
            elif sc == "chaos":
                def fault(c, j):
                    stride = max(2, args.steps // 6)
                    step = stride
                    kills = 0
                    coord_at = rng.randrange(2, 4)
                    while step < args.steps - 1 and kills < 5:
                        if kills == coord_at:
                            kill_coordinator(c, j, step)
                        else:
                            kill_busy(c, j, rng, step)
                        kills += 1
                        step += stride
            else:
                log("unknown scenario", sc)
                failures += 1
                continue
            # Every killed worker comes back (supervised) before the next scenario.
            with cluster.lock:
                for n in cluster.restart:
                    cluster.restart[n] = True
            time.sleep(1.0)
            try:
                job_id, sha, secs = run_job(cluster, root, sc, args, fault)
            except Exception as e:  # noqa: BLE001 - report and continue
                log(f"FAIL {sc}: {e}")
                failures += 1
                continue
            recs = recoveries(cluster, job_id)
            all_rec.extend(recs)
            same = sha == ref_sha
            failures += 0 if same else 1
            log(f"{'PASS' if same else 'FAIL'} {sc} {job_id}: {secs:.1f} s, {len(recs)} recoveries, weights "
                f"{'identical to' if same else 'DIFFER from'} the reference")
            for r in recs:
                log("   ", r["line"][r["line"].find("recovered in"):])
            if sc == "chaos" and recs:
                tot = [r["total"] for r in recs]
                log(f"  chaos: {len(recs)} recoveries, recovery time median {statistics.median(tot):.2f} s, "
                    f"max {max(tot):.2f} s; steps redone {sum(r['redone'] for r in recs)} "
                    f"(max {max(r['redone'] for r in recs)} per failure)")
        if all_rec:
            for src in sorted({r["from"] for r in all_rec}):
                tot = [r["total"] for r in all_rec if r["from"] == src]
                log(f"summary from {src}: n={len(tot)} median {statistics.median(tot):.2f} s max {max(tot):.2f} s")
    finally:
        cluster.close()
        if not args.keep and failures == 0:
            shutil.rmtree(root, ignore_errors=True)
    log("FAILED" if failures else "ALL PASSED", f"({failures} failure(s))")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
