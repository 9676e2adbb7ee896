#!/usr/bin/python3
"""The one launcher of real test clusters: a tandem-coordinator and N
tandem-worker processes on 127.0.0.1 with ephemeral ports, each in its own
process group, rooted in one run directory.

Shared by every harness that runs real processes (tests/README.md):
  python   import it: `from cluster import Cluster` (tests/recovery/recovery_e2e.py)
  bash     its command line (tests/integration/lib.sh)
  C++      its command line, reading the JSON it prints
           (tests/support/real_cluster.h)

Readiness is read from observable state, never from log lines: the
coordinator's machine-readable start-up line gives its ephemeral ports
(the product's documented way to learn them), then /readyz on its metrics
port must answer 200; a worker is ready when `tandemctl workers` lists it
in the state asked for (IDLE by default). Every wait is bounded in count and
time and fails with a message that says what was awaited.

The run directory holds:
  cluster.json                 the description (below), rewritten on each change
  admin.token, join.token      the tokens (0600)
  coordinator.log              the coordinator's stderr; coordinator.out its stdout
  worker-NAME.log              a worker's stdout and stderr
  state/                       the coordinator's state dir
  members/NAME.{pid,exit}      the member's pid and, once it ended, its exit code
                               (128+N for signal N, as a shell reports it)

cluster.json: {"root", "grpc", "metrics", "admin_token_file",
"join_token_file", "bin": {"coordinator", "worker", "tandemctl"},
"ctl_args": [extra tandemctl flags, e.g. TLS], "members": {NAME: {"kind":
"coordinator"|"worker", "pid", "argv", "log", "starts", "exit"}}}. The
coordinator's member name is "coordinator".

Command line (every command takes --dir ROOT; each prints cluster.json's
content, or what it says below, on stdout):
  up [--workers N] [--coordinator-arg A]... [--worker-arg A]... [--no-wait]
                         tokens, coordinator, workers w0..wN-1; waits until
                         every worker is IDLE (unless --no-wait)
  start-coordinator [-- FLAGS]   (again after it stopped: same ports)
  start-worker NAME [--wait] [--rlimit-as BYTES] [-- FLAGS]
  restart NAME [--wait]  the member again with the argv it had
  signal NAME [--signal S] [--wait-exit SECONDS]
                         sends S (default TERM) to the member; with
                         --wait-exit prints its exit code once it ended, and
                         fails (exit 1) when it has not ended in time
  wait-exit NAME         waits (--timeout) until the member ended; prints its exit code
  wait-workers [--state S] (--count N | NAME...) [--timeout T]
  exit-code NAME         the member's exit code, or "running"
  describe               cluster.json
  get KEY                one value of it by dotted path (grpc, members.w0.pid)
  down                   TERM to every member's process group, KILL after
                         10 s; the run directory stays
Binaries: --bin DIR (tandem-coordinator, tandem-worker, tandemctl), else
$TANDEM_COORDINATOR_BIN, $TANDEM_WORKER_BIN, $TANDEMCTL.

Processes started from the command line outlive the command: a small keeper
(this file, `_keep`) waits for each one to write its exit code, and stops it
after --max-seconds (default 1800) should its harness never call `down`.
Processes started by an importing harness are its children and die with it.

Standard library only (python3).
"""
import argparse
import contextlib
import ctypes
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

COORDINATOR = "coordinator"
READY_LINE = re.compile(r"^tandem-coordinator listening grpc=(\S+) metrics=(\S*)", re.M)


class ClusterError(RuntimeError):
    """A member did not start, become ready or stop within its bound."""


def _die_with_parent():
    """PR_SET_PDEATHSIG: the child gets SIGKILL when its parent dies, however it dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass


def exit_code(returncode):
    """Popen's returncode as a shell reports it (128+N for signal N)."""
    return 128 - returncode if returncode < 0 else returncode


def wait_for(pred, timeout, what, interval=0.05):
    """Polls pred until it returns a true value (returned), at most `timeout`
    seconds and timeout/interval+1 times; raises ClusterError naming `what`."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / interval) + 1):
        got = pred()
        if got:
            return got
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    raise ClusterError(f"timed out after {timeout:g} s waiting for {what}")


def default_bins(bindir=None):
    if bindir:
        bindir = os.path.abspath(bindir)
        return {"coordinator": os.path.join(bindir, "tandem-coordinator"),
                "worker": os.path.join(bindir, "tandem-worker"),
                "tandemctl": os.path.join(bindir, "tandemctl")}
    bins = {"coordinator": os.environ.get("TANDEM_COORDINATOR_BIN"),
            "worker": os.environ.get("TANDEM_WORKER_BIN"),
            "tandemctl": os.environ.get("TANDEMCTL")}
    missing = [k for k, v in bins.items() if not v]
    if missing:
        raise ClusterError("no binaries: pass --bin DIR or set TANDEM_COORDINATOR_BIN, TANDEM_WORKER_BIN, TANDEMCTL")
    return bins


class Cluster:
    """A coordinator and workers rooted in `root`. Not thread safe, except
    supervise(), which restarts dead workers from its own thread under the
    cluster's lock.

    detached=False (an importing harness): members are this process's
    children, killed when it dies. detached=True (the command line): members
    outlive this process, each behind a keeper that records its exit code.
    """

    def __init__(self, root, bins=None, detached=False, max_seconds=1800, host="127.0.0.1"):
        self.root = os.path.abspath(root)
        self.host = host  # the coordinator listens here; workers' data address by default
        os.makedirs(os.path.join(self.root, "members"), exist_ok=True)
        self.detached = detached
        self.max_seconds = max_seconds
        self.lock = threading.RLock()
        self.procs = {}  # name -> Popen (children of this process)
        self._supervisor = None
        self._stop_supervising = threading.Event()
        path = os.path.join(self.root, "cluster.json")
        if os.path.exists(path):
            with open(path) as f:
                self.desc = json.load(f)
            if bins:
                self.desc["bin"] = bins
        else:
            self.desc = {"root": self.root, "grpc": "", "metrics": "",
                         "admin_token_file": os.path.join(self.root, "admin.token"),
                         "join_token_file": os.path.join(self.root, "join.token"),
                         "bin": bins or default_bins(), "ctl_args": [], "members": {}}
        for k in ("coordinator", "worker", "tandemctl"):
            b = self.desc["bin"][k]
            if not os.access(b, os.X_OK):
                raise ClusterError(f"{b} is not an executable: build the target first")
        self._make_tokens()
        self.save()

    # ---- description
    def save(self):
        with self.lock:
            tmp = os.path.join(self.root, "cluster.json.tmp")
            with open(tmp, "w") as f:
                json.dump(self.desc, f, indent=1, sort_keys=True)
                f.write("\n")
            os.replace(tmp, os.path.join(self.root, "cluster.json"))

    @property
    def grpc(self):
        return self.desc["grpc"]

    @property
    def metrics(self):
        return self.desc["metrics"]

    def member(self, name):
        m = self.desc["members"].get(name)
        if m is None:
            raise ClusterError(f"no member '{name}' in {self.root}")
        return m

    def pid(self, name):
        return self.member(name)["pid"]

    def log_path(self, name):
        return self.member(name)["log"]

    def _make_tokens(self):
        for key in ("admin_token_file", "join_token_file"):
            path = self.desc[key]
            if not os.path.exists(path):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(os.urandom(32).hex())

    # ---- starting members
    def _spawn(self, name, kind, argv, log, out=None, base=None):
        pidfile = os.path.join(self.root, "members", f"{name}.pid")
        exitfile = os.path.join(self.root, "members", f"{name}.exit")
        for f in (pidfile, exitfile):
            with contextlib.suppress(FileNotFoundError):
                os.remove(f)
        with open(log, "ab") as logf, open(out or log, "ab") as outf:
            if self.detached:
                keeper = [sys.executable, os.path.abspath(__file__), "_keep", "--pid-file", pidfile,
                          "--exit-file", exitfile, "--max-seconds", str(self.max_seconds), "--", *argv]
                kp = subprocess.Popen(keeper, stdin=subprocess.DEVNULL, stdout=outf, stderr=logf,
                                      start_new_session=True, close_fds=True)
                kp.returncode = 0  # not ours to wait for: it outlives this process
                keeper_pid = kp.pid
                pid = int(wait_for(lambda: _read(pidfile), 10, f"the keeper of {name} to start it"))
            else:
                p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=outf, stderr=logf,
                                     start_new_session=True, preexec_fn=_die_with_parent)
                self.procs[name] = p
                pid = keeper_pid = p.pid
                with open(pidfile, "w") as f:
                    f.write(f"{pid}\n")
        with self.lock:
            prev = self.desc["members"].get(name, {})
            self.desc["members"][name] = {"kind": kind, "pid": pid, "keeper": keeper_pid, "argv": argv,
                                          "base_argv": base or argv, "log": log,
                                          "supervised": prev.get("supervised", True),
                                          "starts": prev.get("starts", 0) + 1, "exit": None}
            self.save()
        return pid

    def start_coordinator(self, extra=(), timeout=30):
        """Starts (or starts again, on the same ports and state dir) the
        coordinator; returns once /readyz answers 200."""
        if COORDINATOR in self.desc["members"] and self.running(COORDINATOR):
            raise ClusterError("the coordinator is running already")
        prev = self.desc["members"].get(COORDINATOR)
        if prev and not extra:
            base = list(prev["base_argv"])
        else:
            base = [self.desc["bin"]["coordinator"], "--listen", f"{self.host}:0", "--metrics-listen", f"{self.host}:0",
                    "--state-dir", os.path.join(self.root, "state"),
                    "--admin-token-file", self.desc["admin_token_file"],
                    "--join-token-file", self.desc["join_token_file"], *extra]
        argv = list(base)
        if self.desc["grpc"]:
            # Again on the port the workers know (the last --listen wins).
            argv += ["--listen", self.desc["grpc"]]
        out = os.path.join(self.root, "coordinator.out")
        offset = os.path.getsize(out) if os.path.exists(out) else 0
        self._spawn(COORDINATOR, "coordinator", argv, os.path.join(self.root, "coordinator.log"), out, base)

        def ready_line():
            self._check_alive(COORDINATOR, "during start-up")
            with open(out, errors="replace") as f:
                f.seek(offset)
                return READY_LINE.search(f.read())

        m = wait_for(ready_line, timeout, "the coordinator's start-up line (coordinator.log says why)")
        with self.lock:
            self.desc["grpc"], self.desc["metrics"] = m.group(1), m.group(2)
            self.save()
        if self.desc["metrics"]:
            wait_for(lambda: self._check_alive(COORDINATOR, "before it was ready") and self.readyz(), timeout,
                     f"http://{self.metrics}/readyz to answer 200")
        else:
            wait_for(lambda: self._check_alive(COORDINATOR, "before it was ready") and
                     self.ctl("workers").returncode == 0, timeout, "the coordinator to answer Control calls")
        return self.pid(COORDINATOR)

    def readyz(self):
        try:
            with urllib.request.urlopen(f"http://{self.metrics}/readyz", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def start_worker(self, name, extra=(), wait=False, timeout=60, rlimit_as=None, prefix=(), data_address=None):
        """Starts worker `name` (its --name unless `extra` names another);
        rlimit_as caps its address space (bytes, RLIMIT_AS, through prlimit);
        prefix runs it through a program that execs it (same pid), e.g.
        `ip netns exec NS`; data_address is its collectives' address (the
        cluster's host by default)."""
        if not self.desc["grpc"]:
            raise ClusterError("start the coordinator first")
        if name == COORDINATOR:
            raise ClusterError(f"'{COORDINATOR}' is the coordinator's name")
        argv = [self.desc["bin"]["worker"], "--coordinator", self.desc["grpc"], "--name", name, "--device", "cpu",
                "--data-address", data_address or self.host, "--threads", "1", "--token-file", self.desc["join_token_file"], *extra]
        if rlimit_as:
            argv = ["prlimit", f"--as={rlimit_as}", "--", *argv]  # execs the worker: same pid
        argv = [*prefix, *argv]
        pid = self._spawn(name, "worker", argv, os.path.join(self.root, f"worker-{name}.log"))
        if wait:
            self.wait_workers([name], timeout=timeout)
        return pid

    def restart(self, name, wait=False, timeout=60):
        """The member again, with the argv it had."""
        m = self.member(name)
        if self.running(name):
            raise ClusterError(f"{name} is still running")
        if m["kind"] == "coordinator":
            return self.start_coordinator(timeout=timeout)
        pid = self._spawn(name, "worker", m["argv"], m["log"])
        if wait:
            self.wait_workers([name], timeout=timeout)
        return pid

    def up(self, workers=2, coordinator_args=(), worker_args=(), wait=True, timeout=60):
        self.start_coordinator(coordinator_args, timeout=timeout)
        names = [f"w{i}" for i in range(workers)]
        for n in names:
            self.start_worker(n, worker_args)
        if wait and names:
            self.wait_workers(names, timeout=timeout)
        return names

    # ---- observing
    def ctl(self, *args, timeout=30):
        """tandemctl against this cluster with the admin token; a CompletedProcess."""
        argv = [self.desc["bin"]["tandemctl"], "--coordinator", self.desc["grpc"],
                "--token-file", self.desc["admin_token_file"], *self.desc["ctl_args"], *args]
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            return subprocess.CompletedProcess(argv, 124, e.stdout or "", e.stderr or "")

    def ctl_json(self, *args, timeout=30):
        """tandemctl --output json ARGS: the JSON objects it printed, one a line ([] when it failed)."""
        r = self.ctl("--output", "json", *args, timeout=timeout)
        out = []
        for line in r.stdout.splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
        return out

    def workers(self):
        """{name: WorkerInfo as JSON} from ListWorkers."""
        return {w.get("name"): w for w in self.ctl_json("workers")}

    def wait_workers(self, names=None, state="IDLE", count=None, timeout=60):
        """Until every worker in `names` (or at least `count` workers) is in `state`."""
        want = f"WORKER_STATE_{state}"

        def check():
            ws = self.workers()
            if names:
                return all(ws.get(n, {}).get("state") == want for n in names) and ws
            return len([w for w in ws.values() if w.get("state") == want]) >= count and ws

        what = f"workers {','.join(names)}" if names else f"{count} worker(s)"
        return wait_for(check, timeout, f"{what} in state {state}", interval=0.2)

    def running(self, name):
        m = self.member(name)
        p = self.procs.get(name)
        if p is not None:
            if p.poll() is None:
                return True
            self._record_exit(name, exit_code(p.returncode))
            return False
        # Started by a keeper (here or by another process): its exit file says
        # how the member ended; a keeper killed with its group wrote none.
        code = _read(os.path.join(self.root, "members", f"{name}.exit"))
        if code is not None:
            self._record_exit(name, int(code))
            return False
        return _alive(m["pid"]) or _alive(m.get("keeper", m["pid"]))

    def exit_code(self, name):
        """The member's exit code once it ended (128+N for signal N), else None."""
        if self.running(name):
            return None
        return self.member(name).get("exit")

    def _record_exit(self, name, code):
        with self.lock:
            if self.desc["members"][name].get("exit") != code:
                self.desc["members"][name]["exit"] = code
                self.save()

    def _check_alive(self, name, when):
        if not self.running(name):
            raise ClusterError(f"{name} exited {when} (exit {self.member(name).get('exit')}); see "
                               f"{self.member(name)['log']}")
        return True

    # ---- stopping
    def send_signal(self, name, sig=signal.SIGTERM):
        """Sends sig to the member (not its keeper); returns its pid."""
        pid = self.pid(name)
        if self.running(name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pid

    def wait_exit(self, name, timeout=15):
        """The member's exit code once it ended; ClusterError after timeout."""
        wait_for(lambda: not self.running(name), timeout, f"{name} (pid {self.pid(name)}) to exit")
        p = self.procs.get(name)
        if p is not None:
            p.wait()
        return self.exit_code(name)

    def kill(self, name, sig=signal.SIGKILL, timeout=15):
        """Sends sig and waits until the member ended; returns its exit code."""
        self.send_signal(name, sig)
        return self.wait_exit(name, timeout)

    def supervise(self, interval=0.2):
        """Restarts every worker that ends, until down() (a stand-in for systemd
        or Kubernetes). set_supervised(name, False) leaves one down."""
        def loop():
            while not self._stop_supervising.wait(interval):
                with self.lock:
                    for name, m in list(self.desc["members"].items()):
                        if m["kind"] == "worker" and m.get("supervised", True) and not self.running(name):
                            self._spawn(name, "worker", m["argv"], m["log"])

        self._supervisor = threading.Thread(target=loop, daemon=True)
        self._supervisor.start()

    def set_supervised(self, name, on):
        with self.lock:
            self.member(name)["supervised"] = on
            self.save()

    def down(self, timeout=10):
        """SIGCONT and SIGTERM to every member's process group, SIGKILL to
        whatever is left after `timeout` seconds."""
        self._stop_supervising.set()
        if self._supervisor:
            self._supervisor.join(timeout=5)
        names = list(self.desc["members"])
        for n in names:
            pgid = self.pid(n)  # each member (or its keeper) leads its own group
            if self.running(n):
                for sig in (signal.SIGCONT, signal.SIGTERM):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(os.getpgid(pgid), sig)
        with contextlib.suppress(ClusterError):
            wait_for(lambda: not any(self.running(n) for n in names), timeout, "every member to stop")
        for n in names:
            if self.running(n):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(os.getpgid(self.pid(n)), signal.SIGKILL)
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        for n in names:
            self.running(n)  # records the exit codes


def _read(path):
    try:
        with open(path) as f:
            text = f.read().strip()
        return text or None
    except FileNotFoundError:
        return None


def _alive(pid):
    """pid runs and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False


def _keep(args):
    """Runs argv as a child, writes its pid, waits, writes its exit code;
    stops it after max_seconds. Ignores TERM/INT/HUP (sent to the whole
    group by `down`) so that it outlives its child and records how it ended."""
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    p = subprocess.Popen(args.argv, preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL)
                                                       for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)])
    with open(args.pid_file + ".tmp", "w") as f:
        f.write(f"{p.pid}\n")
    os.replace(args.pid_file + ".tmp", args.pid_file)
    try:
        rc = p.wait(timeout=args.max_seconds)
    except subprocess.TimeoutExpired:
        sys.stderr.write(f"cluster.py: {args.argv[0]} ran past {args.max_seconds} s: killed\n")
        p.kill()
        rc = p.wait()
    with open(args.exit_file + ".tmp", "w") as f:
        f.write(f"{exit_code(rc)}\n")
    os.replace(args.exit_file + ".tmp", args.exit_file)
    return 0


@contextlib.contextmanager
def _locked(root):
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def main(argv):
    ap = argparse.ArgumentParser(prog="cluster.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    def cmd(name, **kw):
        p = sub.add_parser(name, **kw)
        p.add_argument("--dir", required=True, help="the run directory")
        p.add_argument("--bin", help="directory with tandem-coordinator, tandem-worker, tandemctl")
        p.add_argument("--timeout", type=float, default=60, help="seconds for each wait")
        p.add_argument("--max-seconds", type=int, default=1800, help="a member's longest life")
        return p

    p = cmd("up")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--coordinator-arg", action="append", default=[])
    p.add_argument("--worker-arg", action="append", default=[])
    p.add_argument("--ctl-arg", action="append", default=[], help="extra tandemctl flag (TLS)")
    p.add_argument("--no-wait", action="store_true")
    p = cmd("start-coordinator")
    p.add_argument("--ctl-arg", action="append", default=[], help="extra tandemctl flag (TLS)")
    p.add_argument("flags", nargs="*")
    p = cmd("start-worker")
    p.add_argument("name")
    p.add_argument("--rlimit-as", type=int)
    p.add_argument("--wait", action="store_true")
    p.add_argument("flags", nargs="*")
    p = cmd("restart")
    p.add_argument("name")
    p.add_argument("--wait", action="store_true")
    p = cmd("signal")
    p.add_argument("name")
    p.add_argument("--signal", default="TERM")
    p.add_argument("--wait-exit", type=float, default=None)
    p = cmd("wait-exit")
    p.add_argument("name")
    p = cmd("wait-workers")
    p.add_argument("--state", default="IDLE")
    p.add_argument("--count", type=int)
    p.add_argument("names", nargs="*")
    p = cmd("exit-code")
    p.add_argument("name")
    cmd("describe")
    p = cmd("get")
    p.add_argument("key")
    cmd("down")
    k = sub.add_parser("_keep")
    k.add_argument("--pid-file", required=True)
    k.add_argument("--exit-file", required=True)
    k.add_argument("--max-seconds", type=int, required=True)
    k.add_argument("argv", nargs="+")
    args = ap.parse_args(argv)
    if args.cmd == "_keep":
        return _keep(args)

    try:
        with _locked(args.dir):
            bins = default_bins(args.bin) if (args.bin or not os.path.exists(
                os.path.join(args.dir, "cluster.json"))) else None
            c = Cluster(args.dir, bins=bins, detached=True, max_seconds=args.max_seconds)
            out = None
            if args.cmd == "up":
                c.desc["ctl_args"] = args.ctl_arg
                c.up(args.workers, args.coordinator_arg, args.worker_arg, wait=not args.no_wait,
                     timeout=args.timeout)
            elif args.cmd == "start-coordinator":
                if args.ctl_arg:
                    c.desc["ctl_args"] = args.ctl_arg
                c.start_coordinator(args.flags, timeout=args.timeout)
            elif args.cmd == "start-worker":
                c.start_worker(args.name, args.flags, wait=args.wait, timeout=args.timeout, rlimit_as=args.rlimit_as)
            elif args.cmd == "restart":
                c.restart(args.name, wait=args.wait, timeout=args.timeout)
            elif args.cmd == "signal":
                sig = (signal.Signals(int(args.signal)) if args.signal.isdigit()
                       else signal.Signals["SIG" + args.signal.upper().removeprefix("SIG")])
                c.send_signal(args.name, sig)
                if args.wait_exit is not None:
                    out = str(c.wait_exit(args.name, args.wait_exit))
            elif args.cmd == "wait-exit":
                out = str(c.wait_exit(args.name, args.timeout))
            elif args.cmd == "wait-workers":
                if not args.names and not args.count:
                    raise ClusterError("wait-workers: name workers or give --count")
                c.wait_workers(args.names, args.state, args.count, timeout=args.timeout)
            elif args.cmd == "exit-code":
                code = c.exit_code(args.name)
                out = "running" if code is None else str(code)
            elif args.cmd == "get":
                v = c.desc
                for part in args.key.split("."):
                    if not isinstance(v, dict) or part not in v:
                        raise ClusterError(f"no '{args.key}' in cluster.json")
                    v = v[part]
                out = v if isinstance(v, str) else json.dumps(v)
            elif args.cmd == "down":
                c.down()
            c.save()
            print(out if out is not None else json.dumps(c.desc, sort_keys=True))
            return 0
    except ClusterError as e:
        print(f"cluster.py {args.cmd}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
