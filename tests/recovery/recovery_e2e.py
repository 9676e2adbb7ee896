#!/usr/bin/python3
"""Recovery with real processes on 127.0.0.1, bounded.

Starts tandem-coordinator and tandem-worker processes (a local supervisor
restarts a worker that dies, as systemd or Kubernetes would), runs a tiny job
once without faults for the reference weights, then once per scenario with
faults, and compares the sha256 of the exported safetensors. Faults are timed
from the workers' own phase log lines ("worker: job J gen G PHASE_X step S"),
so they land in the phase named, however fast the job runs:

  kill-worker        kill -9 a busy worker mid-run (restarted by the supervisor)
  kill-spare         kill -9 a busy worker; an idle spare replaces it
  kill-rollout       kill -9 a worker in a ROLLOUT phase (grpo)
  kill-update        kill -9 a worker in an UPDATE phase (grpo; SFT_STEP for sft)
  kill-checkpoint    kill -9 a worker as a CHECKPOINT starts (its write in flight)
  sigterm            SIGTERM a busy worker (graceful preemption)
  kill-coordinator   kill -9 the coordinator mid-run; restart it on the same state dir
  corrupt-checkpoint freeze the job (SIGSTOP), damage its newest recorded checkpoint
                     (--corrupt: flip a byte, truncate a shard, delete a shard; one
                     round each), kill -9 every worker of the job: it must recover
                     from the previous checkpoint and say so in its events
  chaos              --chaos-kills kills of random busy workers in random phases,
                     one of them of the coordinator; prints recovery time median/max
                     and the steps redone

Prints one line per recovery ("recovered in ...") and a summary. Exit 0 when
every scenario finished with weights identical to the reference. Uses only the
Python standard library; every wait is bounded (--limit per job).

  tests/recovery/recovery_e2e.py --bin build/bin [--kind grpo] [--scenarios kill-worker,chaos]
"""
import argparse
import ctypes
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

MODEL = """
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
cluster: {{workers: {workers}, zero_stage: 2, threads_per_worker: 1}}
checkpoint: {{every: {every}, keep: 3}}
recovery: {{replacement_timeout_ms: 30000}}
output_dir: {out}
"""

JOBS = {
    "sft": """
name: recovery-e2e-sft
kind: sft
task: {{name: arithmetic, op: add, digits: 2, eval_size: 16}}
train: {{steps: {steps}, lr: 3.0e-3, global_batch: 16, micro_batch: 4, warmup_steps: 2, seq_len: 16}}
""" + MODEL,
    "grpo": """
name: recovery-e2e-grpo
kind: grpo
task: {{name: arithmetic, op: add, digits: 1, eval_size: 8}}
init: {{sft: {{steps: 2, lr: 3.0e-3}}}}
train: {{steps: {steps}, lr: 1.0e-3, global_batch: 8, micro_batch: 2, warmup_steps: 0, seq_len: 16}}
rl: {{group_size: 4, prompts_per_step: 4, clip: 0.2, kl_coef: 0.0, max_new_tokens: 3, temperature: 1.0, epochs: 1, mini_batches: 1}}
""" + MODEL,
}

def _die_with_parent():
    """Child processes get SIGKILL when the harness dies, however it dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


PHASE_LINE = re.compile(r"worker: job (\S+) gen (\d+) (PHASE_\w+) step (-?\d+)")


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


class PhaseWatch:
    """Follows the workers' logs from the moment it is made; yields phase starts."""

    def __init__(self, root):
        self.root = root
        self.pos = {}
        self.rest = {}
        self.history = []
        for path in glob.glob(os.path.join(root, "w*.log")):
            self.pos[path] = os.path.getsize(path)

    def read(self):
        for path in sorted(glob.glob(os.path.join(self.root, "w*.log"))):
            with open(path, "rb") as f:
                f.seek(self.pos.get(path, 0))
                data = f.read()
            self.pos[path] = self.pos.get(path, 0) + len(data)
            text = self.rest.get(path, "") + data.decode("utf-8", "replace")
            lines = text.split("\n")
            self.rest[path] = lines.pop()
            name = os.path.basename(path)[:-4]
            for line in lines:
                m = PHASE_LINE.search(line)
                if m:
                    self.history.append({"worker": name, "job": m.group(1), "gen": int(m.group(2)),
                                         "phase": m.group(3), "step": int(m.group(4))})

    def wait(self, pred, limit, what):
        """The first phase start matching pred logged after this call."""
        self.read()
        seen = len(self.history)
        deadline = time.time() + limit
        while time.time() < deadline:
            self.read()
            for ev in self.history[seen:]:
                if pred(ev):
                    return ev
            seen = len(self.history)
            time.sleep(0.005)
        raise RuntimeError(f"timed out after {limit}s waiting for {what}")

    def members(self, job_id, gen):
        self.read()
        return {e["worker"] for e in self.history if e["job"] == job_id and e["gen"] == gen}


class Cluster:
    def __init__(self, bindir, root, workers, spares):
        self.bin = bindir
        self.root = root
        self.port = None
        self.coord = None
        self.stop = False
        self.workers = {}  # name -> Popen
        self.restart = {}  # name -> bool (supervised)
        self.logs = []
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
        self.logs.append(logf)
        self.coord = subprocess.Popen(
            [os.path.join(self.bin, "tandem-coordinator"), "--listen", listen, "--metrics-listen", "",
             "--state-dir", os.path.join(self.root, "state"), "--admin-token-file", os.path.join(self.root, "token"),
             "--join-token-file", os.path.join(self.root, "token"), "--lease-ms", "2000", "--heartbeat-ms", "250",
             "--set", "replacement_timeout_ms=30000"],
            stdout=subprocess.PIPE, stderr=logf, text=True, preexec_fn=_die_with_parent)
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
        self.logs.append(logf)
        p = subprocess.Popen(
            [os.path.join(self.bin, "tandem-worker"), "--coordinator", f"127.0.0.1:{self.port}", "--name", name,
             "--threads", "1", "--token-file", os.path.join(self.root, "token"), "--data-address", "127.0.0.1"],
            stdout=logf, stderr=logf, preexec_fn=_die_with_parent)
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

    def signal_worker(self, name, sig, restart=True):
        with self.lock:
            p = self.workers[name]
            self.restart[name] = restart
        p.send_signal(sig)
        return p.pid

    def close(self):
        self.stop = True
        with self.lock:
            procs = list(self.workers.values())
        for p in procs + [self.coord]:
            if p and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for p in procs + [self.coord]:
            if p:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for f in self.logs:
            f.close()


def state_of(job):
    s = (job or {}).get("state", "")
    return s.replace("JOB_STATE_", "").lower()


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


def job_log(cluster, job_id):
    return cluster.ctl("logs", job_id).stdout


def recoveries(text):
    out = []
    for line in text.splitlines():
        m = re.search(r"recovered in ([\d.]+) s: detect ([\d.]+) s, wait ([\d.]+) s, rendezvous ([\d.]+) s, "
                      r"restore ([\d.]+) s from (\S+ ?\S*); resuming at step (\d+) \((\d+) steps? redone\)", line)
        if m:
            out.append({"total": float(m.group(1)), "detect": float(m.group(2)), "wait": float(m.group(3)),
                        "rendezvous": float(m.group(4)), "restore": float(m.group(5)), "from": m.group(6),
                        "redone": int(m.group(8)), "line": line.strip()})
    return out


def ckpt_root(cluster, job_id):
    return os.path.join(cluster.root, "state", "runs", job_id, "checkpoints")


def in_job(job_id, phases=None, min_step=1):
    return lambda ev: ev["job"] == job_id and ev["step"] >= min_step and (phases is None or ev["phase"] in phases)


def kill_at(cluster, watch, job_id, phases, min_step, sig=signal.SIGKILL, restart=True, limit=120):
    ev = watch.wait(in_job(job_id, phases, min_step), limit, f"{phases or 'any phase'} at step >= {min_step}")
    pid = cluster.signal_worker(ev["worker"], sig, restart)
    log(f"  {signal.Signals(sig).name} worker {ev['worker']} (pid {pid}) in {ev['phase']} step {ev['step']} "
        f"gen {ev['gen']}")
    return ev


def kill_coordinator(cluster, watch, job_id, min_step, limit=120):
    ev = watch.wait(in_job(job_id, None, min_step), limit, f"step >= {min_step}")
    log(f"  SIGKILL coordinator (pid {cluster.coord.pid}) while {ev['worker']} is in {ev['phase']} step {ev['step']}")
    cluster.coord.kill()
    cluster.coord.wait()
    time.sleep(0.5)
    cluster.start_coordinator()


def recorded_checkpoints(cluster, job_id):
    r = cluster.ctl("checkpoints", job_id, "--output", "json")
    return sorted({int(s) for s in re.findall(r"step-0*(\d+)", r.stdout)})


def corrupt(path, how):
    shards = sorted(glob.glob(os.path.join(path, "shard-*.bin")))
    if not shards:
        raise RuntimeError(f"no shards in {path}")
    victim = shards[-1]
    if how == "flip":
        with open(victim, "r+b") as f:
            f.seek(os.path.getsize(victim) // 2)
            b = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([b[0] ^ 0x5A]))
    elif how == "truncate":
        os.truncate(victim, os.path.getsize(victim) // 2)
    elif how == "delete":
        os.remove(victim)
    else:
        raise RuntimeError(f"unknown corruption {how}")
    return os.path.basename(victim)


def corrupt_rounds(cluster, watch, job_id, args, modes, expect):
    """Per mode: freeze the job, damage its newest recorded checkpoint, kill every worker of it."""
    step = args.steps // 4
    for how in modes:
        # The job is at a step past at least two checkpoints of this generation.
        ev = watch.wait(in_job(job_id, None, step + 2 * args.every), 120, f"step >= {step + 2 * args.every}")
        gen = ev["gen"]
        members = watch.members(job_id, gen)
        deadline = time.time() + 10
        while len(members) < args.workers and time.time() < deadline:
            time.sleep(0.005)
            members = watch.members(job_id, gen)
        for n in members:
            cluster.signal_worker(n, signal.SIGSTOP)
        time.sleep(0.5)  # reports already sent are recorded
        steps = recorded_checkpoints(cluster, job_id)
        if len(steps) < 2:
            raise RuntimeError(f"corrupt-checkpoint: only {steps} recorded")
        newest = os.path.join(ckpt_root(cluster, job_id), f"step-{steps[-1]:08d}")
        shard = corrupt(newest, how)
        expect.append(newest)
        for n in sorted(members):
            cluster.signal_worker(n, signal.SIGKILL)
        log(f"  {how}: {os.path.basename(newest)}/{shard} damaged (recorded {steps}); SIGKILL {sorted(members)} "
            f"(job at step {ev['step']} gen {gen})")
        step = steps[-1] + 1


def chaos(cluster, watch, job_id, args, rng):
    kills = args.chaos_kills
    stride = max(2, (args.steps - 2) // (kills + 1))
    coord_at = rng.randrange(1, kills)
    phases = [None, ["PHASE_ROLLOUT"], ["PHASE_UPDATE", "PHASE_SFT_STEP"], ["PHASE_CHECKPOINT"]]
    step = stride
    for k in range(kills):
        if k == coord_at:
            kill_coordinator(cluster, watch, job_id, step)
        else:
            ph = rng.choice(phases if args.kind == "grpo" else [None, ["PHASE_CHECKPOINT"]])
            if ph and ph[0] == "PHASE_CHECKPOINT":
                s = step + (-step) % args.every
            else:
                s = step
            kill_at(cluster, watch, job_id, ph, s)
        step += stride


def run_job(cluster, root, tag, args, fault=None):
    out = os.path.join(root, f"final-{tag}")
    spec = os.path.join(root, f"{tag}.yaml")
    with open(spec, "w") as f:
        f.write(JOBS[args.kind].format(steps=args.steps, workers=args.workers, every=args.every, out=out))
    watch = PhaseWatch(root)
    job_id = submit(cluster, spec)
    t0 = time.time()
    if fault:
        fault(cluster, watch, job_id)
    job = wait(cluster, job_id, lambda j: state_of(j) in ("succeeded", "failed", "cancelled"),
               max(10, args.limit - (time.time() - t0)))
    if state_of(job) != "succeeded":
        raise RuntimeError(f"{tag}: job {job_id} ended {state_of(job)}: {job.get('reason')}")
    return job_id, weights_sha(out), time.time() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--kind", choices=sorted(JOBS), default="sft")
    ap.add_argument("--scenarios", default="kill-worker,kill-spare,kill-coordinator,sigterm,chaos")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--corrupt", default="flip,truncate,delete", help="corrupt-checkpoint rounds")
    ap.add_argument("--chaos-kills", type=int, default=5, help="faults in the chaos job (one of the coordinator)")
    ap.add_argument("--limit", type=int, default=240, help="seconds per job")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the run directory")
    args = ap.parse_args()
    # `timeout` and ctest stop the harness with SIGTERM: leave through the cleanup.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rng = random.Random(args.seed)
    root = tempfile.mkdtemp(prefix="tandem-recovery-e2e-")
    log("run dir", root)
    failures = 0
    t_start = time.time()
    cluster = Cluster(os.path.abspath(args.bin), root, args.workers, spares=1)
    mid = args.steps // 2
    upd = ["PHASE_UPDATE"] if args.kind == "grpo" else ["PHASE_SFT_STEP"]
    try:
        time.sleep(1.0)
        ref_id, ref_sha, ref_s = run_job(cluster, root, "reference", args)
        log(f"reference {args.kind} {ref_id}: {args.steps} steps in {ref_s:.1f} s, weights sha256 {ref_sha[:16]}")
        all_rec = []
        for sc in [s for s in args.scenarios.split(",") if s]:
            expect_unusable = []
            if sc == "kill-worker":
                fault = lambda c, w, j: kill_at(c, w, j, None, mid)
            elif sc == "kill-spare":
                fault = lambda c, w, j: kill_at(c, w, j, None, mid, restart=False)
            elif sc == "kill-rollout":
                fault = lambda c, w, j: kill_at(c, w, j, ["PHASE_ROLLOUT"], mid)
            elif sc == "kill-update":
                fault = lambda c, w, j: kill_at(c, w, j, upd, mid)
            elif sc == "kill-checkpoint":
                def fault(c, w, j):
                    ev = kill_at(c, w, j, ["PHASE_CHECKPOINT"], mid)
                    left = sorted(os.listdir(ckpt_root(c, j)))
                    log(f"  checkpoint dir right after the kill: {left}")
                    return ev
            elif sc == "sigterm":
                fault = lambda c, w, j: kill_at(c, w, j, None, mid, sig=signal.SIGTERM)
            elif sc == "kill-coordinator":
                fault = lambda c, w, j: kill_coordinator(c, w, j, mid)
            elif sc == "corrupt-checkpoint":
                modes = [m for m in args.corrupt.split(",") if m]
                fault = lambda c, w, j, m=modes, e=expect_unusable: corrupt_rounds(c, w, j, args, m, e)
            elif sc == "chaos":
                fault = lambda c, w, j: chaos(c, w, j, args, rng)
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
            text = job_log(cluster, job_id)
            recs = recoveries(text)
            all_rec.extend(recs)
            ok = sha == ref_sha
            why = f"weights {'identical to' if ok else 'DIFFER from'} the reference"
            if sc == "sigterm" and "preempted (SIGTERM)" not in text:
                # The worker asked to leave; the job handed it over at a step
                # boundary instead of finding it lost.
                ok = False
                why += "; no event says the worker was preempted (SIGTERM): it was lost instead"
            for path in expect_unusable:
                said = [l for l in text.splitlines() if f"checkpoint {path} is unusable" in l]
                if said:
                    log("   ", said[0][said[0].find("checkpoint "):])
                else:
                    ok = False
                    why += f"; no event says {os.path.basename(path)} is unusable"
            if sc != "kill-coordinator" and not recs:
                ok = False
                why += "; no recovery event"
            failures += 0 if ok else 1
            log(f"{'PASS' if ok else 'FAIL'} {sc} {job_id}: {secs:.1f} s, {len(recs)} recoveries, {why}")
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
    except Exception as e:  # noqa: BLE001 - the reference run failed
        log(f"FAIL: {e}")
        failures += 1
    except SystemExit:
        log("FAIL: stopped by a signal")
        failures += 1
    finally:
        cluster.close()
        if failures:
            for path in sorted(glob.glob(os.path.join(root, "*.log"))):
                with open(path, errors="replace") as f:
                    tail = f.readlines()[-15:]
                print(f"--- {path} (tail)\n" + "".join(tail), flush=True)
        if not args.keep and failures == 0:
            shutil.rmtree(root, ignore_errors=True)
    log("FAILED" if failures else "ALL PASSED", f"({failures} failure(s)) in {time.time() - t_start:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
