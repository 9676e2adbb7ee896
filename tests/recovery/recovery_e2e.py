#!/usr/bin/python3
"""Recovery with real processes on 127.0.0.1, bounded.

Starts tandem-coordinator and tandem-worker processes through the test
cluster launcher (tests/support/cluster.py), whose supervisor restarts a
worker that dies, as systemd or Kubernetes would; runs a tiny job once
without faults for the reference weights, then once per scenario with
faults, and compares the sha256 of the exported safetensors. What happened is
read from the job's events (`tandemctl events`): the recoveries with their
timings, the preemption, the unusable checkpoints. Faults are fired when a
worker starts the phase named; the one signal that lands a kill inside a
phase of a few milliseconds is the worker's own line as the phase starts
("worker: job J gen G PHASE_X step S"), so that line times the faults and
nothing else:

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
import glob
import hashlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import cluster as launcher  # noqa: E402  tests/support/cluster.py

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

PHASE_LINE = re.compile(r"worker: job (\S+) gen (\d+) (PHASE_\w+) step (-?\d+)")


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


class PhaseWatch:
    """Follows the workers' logs from the moment it is made; yields phase
    starts (the trigger of the faults, never what a scenario checks)."""

    def __init__(self, root):
        self.root = root
        self.pos = {}
        self.rest = {}
        self.history = []
        for path in glob.glob(os.path.join(root, "worker-*.log")):
            self.pos[path] = os.path.getsize(path)

    def read(self):
        for path in sorted(glob.glob(os.path.join(self.root, "worker-*.log"))):
            with open(path, "rb") as f:
                f.seek(self.pos.get(path, 0))
                data = f.read()
            self.pos[path] = self.pos.get(path, 0) + len(data)
            text = self.rest.get(path, "") + data.decode("utf-8", "replace")
            lines = text.split("\n")
            self.rest[path] = lines.pop()
            name = os.path.basename(path)[len("worker-"):-len(".log")]
            for line in lines:
                m = PHASE_LINE.search(line)
                if m:
                    self.history.append({"worker": name, "job": m.group(1), "gen": int(m.group(2)),
                                         "phase": m.group(3), "step": int(m.group(4))})

    def wait(self, pred, limit, what):
        """The first phase start matching pred logged after this call."""
        self.read()
        seen = len(self.history)
        def match():
            nonlocal seen
            self.read()
            for ev in self.history[seen:]:
                if pred(ev):
                    return ev
            seen = len(self.history)
            return None

        return launcher.wait_for(match, limit, what, interval=0.005)

    def members(self, job_id, gen):
        self.read()
        return {e["worker"] for e in self.history if e["job"] == job_id and e["gen"] == gen}


def start_cluster(bindir, root, workers, spares):
    """A coordinator and workers w0.. (the last `spares` of them idle spares),
    supervised: a worker that ends is started again."""
    c = launcher.Cluster(root, bins=launcher.default_bins(bindir))
    c.start_coordinator(["--lease-ms", "2000", "--heartbeat-ms", "250", "--set", "replacement_timeout_ms=30000"])
    names = [f"w{i}" for i in range(workers + spares)]
    for n in names:
        c.start_worker(n)
    c.wait_workers(names, timeout=60)
    c.supervise()
    return c


def signal_worker(cluster, name, sig, restart=True):
    """Sends sig to a worker; restart=False leaves it down once it ends."""
    cluster.set_supervised(name, restart)
    return cluster.send_signal(name, sig)


def job_of(cluster, job_id):
    got = cluster.ctl_json("status", job_id)
    return got[0] if got else None


def state_of(job):
    s = (job or {}).get("state", "")
    return s.replace("JOB_STATE_", "").lower()


def submit(cluster, spec_path):
    r = cluster.ctl("submit", spec_path, "--output", "json")
    if r.returncode != 0:
        raise RuntimeError(f"submit failed: {r.stdout} {r.stderr}")
    d = json.loads(r.stdout.strip().splitlines()[0])
    return d.get("job_id") or d.get("jobId")


def wait_ended(cluster, job_id, limit):
    """The job once it is SUCCEEDED, FAILED or CANCELLED (a coordinator
    restarting in between answers nothing for a while)."""
    last = {}

    def ended():
        last["job"] = job_of(cluster, job_id)
        return last["job"] if state_of(last["job"]) in ("succeeded", "failed", "cancelled") else None

    try:
        return launcher.wait_for(ended, limit, f"job {job_id} to end", interval=0.1)
    except launcher.ClusterError as e:
        raise RuntimeError(f"{e}: {last.get('job')}") from None


def weights_sha(out):
    files = sorted(glob.glob(os.path.join(out, "*.safetensors")))
    if not files:
        raise RuntimeError(f"no safetensors in {out}")
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()


def job_events(cluster, job_id):
    """Every event recorded for the (ended) job, oldest first."""
    r = cluster.ctl("--output", "json", "events", job_id, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"tandemctl events {job_id} failed ({r.returncode}): {r.stderr.strip()}")
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


def recovery_messages(events):
    return [e.get("message", "") for e in events if e.get("kind") == "recovery"]


SOURCES = {1: "peer", 2: "disk", 3: "live"}  # tandem.v1.RestoreSource


def recoveries(events):
    """The completed recoveries: "recovery" events with their timings in metrics.extra."""
    out = []
    for e in events:
        x = (e.get("metrics") or {}).get("extra") or {}
        if e.get("kind") != "recovery" or "recovery_seconds" not in x:
            continue
        out.append({"total": x["recovery_seconds"], "detect": x.get("detect_seconds", 0),
                    "wait": x.get("wait_seconds", 0), "rendezvous": x.get("rendezvous_seconds", 0),
                    "restore": x.get("restore_seconds", 0),
                    "from": SOURCES.get(int(x.get("restore_source", 0)), "scratch"),
                    "redone": int(x.get("steps_redone", 0)), "line": e.get("message", "")})
    return out


def ckpt_root(cluster, job_id):
    return os.path.join(cluster.root, "state", "runs", job_id, "checkpoints")


def in_job(job_id, phases=None, min_step=1):
    return lambda ev: ev["job"] == job_id and ev["step"] >= min_step and (phases is None or ev["phase"] in phases)


def kill_at(cluster, watch, job_id, phases, min_step, sig=signal.SIGKILL, restart=True, limit=120):
    ev = watch.wait(in_job(job_id, phases, min_step), limit, f"{phases or 'any phase'} at step >= {min_step}")
    pid = signal_worker(cluster, ev["worker"], sig, restart)
    log(f"  {signal.Signals(sig).name} worker {ev['worker']} (pid {pid}) in {ev['phase']} step {ev['step']} "
        f"gen {ev['gen']}")
    return ev


def kill_coordinator(cluster, watch, job_id, min_step, limit=120):
    ev = watch.wait(in_job(job_id, None, min_step), limit, f"step >= {min_step}")
    log(f"  SIGKILL coordinator (pid {cluster.pid(launcher.COORDINATOR)}) while {ev['worker']} is in {ev['phase']} "
        f"step {ev['step']}")
    cluster.kill(launcher.COORDINATOR)
    cluster.restart(launcher.COORDINATOR)  # same port and state dir


def recorded_checkpoints(cluster, job_id):
    return sorted({int(c["step"]) for c in cluster.ctl_json("checkpoints", job_id)})


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
        members = launcher.wait_for(
            lambda: len(watch.members(job_id, gen)) >= args.workers and watch.members(job_id, gen), 10,
            f"every member of generation {gen} to start a phase", interval=0.005)
        for n in members:
            signal_worker(cluster, n, signal.SIGSTOP)
        # Frozen mid-step; two checkpoints at least are recorded.
        steps = launcher.wait_for(lambda: (lambda s: len(s) >= 2 and s)(recorded_checkpoints(cluster, job_id)), 10,
                                  "two recorded checkpoints", interval=0.1)
        newest = os.path.join(ckpt_root(cluster, job_id), f"step-{steps[-1]:08d}")
        shard = corrupt(newest, how)
        expect.append(newest)
        # A newer checkpoint on disk may have its record still on the way from
        # the frozen workers: damaged as well, so that no recovery restores
        # from it, whenever its record lands.
        for d in sorted(glob.glob(os.path.join(ckpt_root(cluster, job_id), "step-*"))):
            m = re.search(r"step-0*(\d+)$", d)
            if m and int(m.group(1)) > steps[-1] and glob.glob(os.path.join(d, "shard-*.bin")):
                log(f"  {how}: {os.path.basename(d)} (not recorded yet) damaged too: {corrupt(d, how)}")
        for n in sorted(members):
            signal_worker(cluster, n, signal.SIGKILL)
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
    job = wait_ended(cluster, job_id, max(10, args.limit - (time.time() - t0)))
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
    cluster = None
    mid = args.steps // 2
    upd = ["PHASE_UPDATE"] if args.kind == "grpo" else ["PHASE_SFT_STEP"]
    try:
        cluster = start_cluster(os.path.abspath(args.bin), root, args.workers, spares=1)
        names = sorted(n for n, m in cluster.desc["members"].items() if m["kind"] == "worker")
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
            # Every killed worker comes back (supervised) and is idle before the next scenario.
            for n in names:
                cluster.set_supervised(n, True)
            try:
                cluster.wait_workers(names, timeout=60)
                job_id, sha, secs = run_job(cluster, root, sc, args, fault)
            except Exception as e:  # noqa: BLE001 - report and continue
                log(f"FAIL {sc}: {e}")
                failures += 1
                continue
            events = job_events(cluster, job_id)
            said = recovery_messages(events)
            recs = recoveries(events)
            all_rec.extend(recs)
            ok = sha == ref_sha
            why = f"weights {'identical to' if ok else 'DIFFER from'} the reference"
            if sc == "sigterm" and not any("preempted (SIGTERM)" in m for m in said):
                # The worker asked to leave; the job handed it over at a step
                # boundary instead of finding it lost.
                ok = False
                why += "; no event says the worker was preempted (SIGTERM): it was lost instead"
            for path in expect_unusable:
                unusable = [m for m in said if f"checkpoint {path} is unusable" in m]
                if unusable:
                    log("   ", unusable[0][unusable[0].find("checkpoint "):])
                else:
                    ok = False
                    why += f"; no event says {os.path.basename(path)} is unusable"
            if sc != "kill-coordinator" and not recs:
                ok = False
                why += "; no recovery event"
            failures += 0 if ok else 1
            log(f"{'PASS' if ok else 'FAIL'} {sc} {job_id}: {secs:.1f} s, {len(recs)} recoveries, {why}")
            for r in recs:
                log("   ", r["line"])
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
        if cluster:
            cluster.down()
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
