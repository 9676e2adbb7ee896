#!/usr/bin/python3
"""Reproduces the known slow worker exit (docs/operations.md "Known issue").

Not a ctest test (it takes ~50 s and fails until the issue is fixed). Kills a
busy worker (the supervisor restarts it), then kill -9s the restarted worker
as soon as it starts the generation-2 SETUP. The survivor is then blocked in
that SETUP's rendezvous (gloo::rendezvous::Context::connectFullMesh ->
tcp::Pair::connect, waiting up to collective_timeout_ms = 60 s for the dead
peer), which neither abort_job nor the shutdown abort reaches: the engine's
Abort() only aborts the installed context's collective, and the context being
set up has none yet. SIGTERM to the survivor then ends by the 45 s watchdog.
Prints the survivor's exit time (want: well under 20 s).

  tests/recovery/slow_exit_repro.py --bin build/bin
"""
import argparse
import os
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import recovery_e2e as e  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="tandem-slow-exit-")
    c = None
    took = None
    try:
        c = e.start_cluster(os.path.abspath(args.bin), root, 2, spares=0)
        spec = os.path.join(root, "job.yaml")
        with open(spec, "w") as f:
            f.write(e.JOBS["sft"].format(steps=400, workers=2, every=2, out=os.path.join(root, "out")))
        watch = e.PhaseWatch(root)
        job = e.submit(c, spec)
        victim = e.kill_at(c, watch, job, None, 4)["worker"]  # restarted by the supervisor
        watch.wait(lambda x: x["job"] == job and x["worker"] == victim and x["phase"] == "PHASE_SETUP"
                   and x["gen"] >= 2, 30, "the restarted worker's SETUP")
        e.signal_worker(c, victim, signal.SIGKILL, restart=False)
        e.log(f"  SIGKILL restarted {victim} in its SETUP")
        survivor = "w1" if victim == "w0" else "w0"
        # The survivor's SETUP of that generation has started; what is
        # reproduced is its rendezvous waiting for the dead peer, which no
        # event shows: a while inside it is the condition of the repro.
        def survivor_setup(x):
            return x["job"] == job and x["worker"] == survivor and x["phase"] == "PHASE_SETUP" and x["gen"] >= 2

        watch.read()
        if not any(survivor_setup(x) for x in watch.history):
            watch.wait(survivor_setup, 30, "the survivor's SETUP")
        time.sleep(1.5)
        t0 = time.time()
        e.signal_worker(c, survivor, signal.SIGTERM, restart=False)
        try:
            rc = c.wait_exit(survivor, timeout=60)
        except e.launcher.ClusterError:
            rc = None
        took = time.time() - t0
        e.log(f"survivor {survivor} exited {took:.1f} s after SIGTERM (rc {rc})")
    finally:
        if c:
            c.down()
        shutil.rmtree(root, ignore_errors=True)
    return 0 if took is not None and took < 20 else 1


if __name__ == "__main__":
    sys.exit(main())
