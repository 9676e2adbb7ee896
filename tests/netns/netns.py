#!/usr/bin/python3
"""Emulated network tiers on one machine: Linux network namespaces joined
by veth pairs, with `tc` rate limits, created and torn down by this module.

Topology of one run (every name carries the run's id, so runs in parallel
do not collide; interface names live inside the run's own namespaces):

    namespace tnn-ID-c   the coordinator: bridge br0, 10.250.0.1/24
    namespace tnn-ID-nK  emulated node K: eth0 10.250.0.(10+K)/24, one veth
                         pair to the bridge (port nK in tnn-ID-c)

Traffic between two nodes leaves a node through its eth0 and enters the
other through the bridge port towards it: both egresses carry a token
bucket (tbf) at the inter-node rate. The workers of one node share its
namespace and address, so their traffic runs over that namespace's
loopback, which carries a tbf at the intra-node rate. Every address lives
on the harness's own links inside its own namespaces; the root namespace
gets no address, route or link, and nothing is sent anywhere else.

Cleanup: Tiers.close() (also on an exception in `with Tiers(...)`, on
SIGTERM/SIGINT/SIGHUP and at interpreter exit) kills every process still
inside the run's namespaces and deletes those namespaces, which removes
their links and qdiscs. It deletes only what this object created; at start
it refuses names that exist already and removes nothing.

Needs root and `ip`/`tc` (Debian package iproute2); require() fails with a
message naming both otherwise. Standard library only.
"""
import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

SUBNET = "10.250.0"
COORD_ADDR = f"{SUBNET}.1"
PREFIX_LEN = 24


class NetnsError(RuntimeError):
    """A namespace, link or qdisc could not be set up, or a check failed."""


def require():
    """Fails (NetnsError) unless this process can create namespaces and
    links: root, and `ip` and `tc` from iproute2."""
    missing = [p for p in ("ip", "tc") if shutil.which(p) is None]
    problems = []
    if os.geteuid() != 0:
        problems.append(f"it runs as uid {os.geteuid()}, and network namespaces, veth links and tc qdiscs need root")
    if missing:
        problems.append(f"{' and '.join(missing)} not found: install the Debian package iproute2 "
                        "(deploy/install-deps.sh --for-tests)")
    if problems:
        raise NetnsError("the emulated-tier harness needs root and iproute2 (ip, tc): " + "; ".join(problems))


def _run(argv, check=True, timeout=20):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def _existing_namespaces():
    r = _run(["ip", "netns", "list"], check=False)
    return {line.split()[0] for line in r.stdout.splitlines() if line.strip()}


def _tbf(rate_mbit):
    """tbf arguments for a rate in Mbit/s: a bucket of at least 4 ms of
    traffic and 256 KiB (veth and loopback hand over GSO packets of up to
    64 KiB), a queue of 20 ms."""
    burst = max(256 * 1024, int(rate_mbit * 1e6 / 8 * 0.004))
    return ["tbf", "rate", f"{rate_mbit}mbit", "burst", str(burst), "latency", "20ms"]


class Tiers:
    """One run's namespaces: a coordinator namespace and `nodes` node
    namespaces, `intra_mbit` inside a node and `inter_mbit` between nodes."""

    _live = set()  # instances not closed yet (closed at exit and on signals)
    _lock = threading.Lock()

    def __init__(self, nodes=2, intra_mbit=10000, inter_mbit=1000):
        if not 1 <= nodes <= 200:
            raise NetnsError(f"nodes: {nodes} (1-200)")
        self.nodes = nodes
        self.intra_mbit = intra_mbit
        self.inter_mbit = inter_mbit
        self.created = []  # namespace names, in creation order
        self.closed = False
        existing = _existing_namespaces()
        for _ in range(20):
            self.id = os.urandom(3).hex()
            names = [self.coord_ns] + [self.node_ns(k) for k in range(nodes)]
            if not existing.intersection(names):
                break
        else:
            raise NetnsError("no free run id for the namespaces (20 tries)")

    # ---- names
    @property
    def coord_ns(self):
        return f"tnn-{self.id}-c"

    def node_ns(self, k):
        return f"tnn-{self.id}-n{k}"

    def node_addr(self, k):
        return f"{SUBNET}.{10 + k}"

    def exec_prefix(self, ns):
        return ["ip", "netns", "exec", ns]

    # ---- set-up and teardown
    def __enter__(self):
        self.open()
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _add_ns(self, name):
        if name in _existing_namespaces():
            raise NetnsError(f"namespace {name} exists already: it is not this run's, left alone")
        _run(["ip", "netns", "add", name])
        self.created.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    def open(self):
        require()
        with Tiers._lock:
            Tiers._live.add(self)
        _install_handlers()
        try:
            c = self.coord_ns
            self._add_ns(c)
            _run(["ip", "-n", c, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", c, "addr", "add", f"{COORD_ADDR}/{PREFIX_LEN}", "dev", "br0"])
            _run(["ip", "-n", c, "link", "set", "br0", "up"])
            for k in range(self.nodes):
                n = self.node_ns(k)
                self._add_ns(n)
                port = f"n{k}"
                # Both ends are made inside the run's namespaces.
                _run(["ip", "-n", c, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", n])
                _run(["ip", "-n", c, "link", "set", port, "master", "br0"])
                _run(["ip", "-n", c, "link", "set", port, "up"])
                _run(["ip", "-n", n, "addr", "add", f"{self.node_addr(k)}/{PREFIX_LEN}", "dev", "eth0"])
                _run(["ip", "-n", n, "link", "set", "eth0", "up"])
                _run(["tc", "-n", n, "qdisc", "add", "dev", "eth0", "root", *_tbf(self.inter_mbit)])
                _run(["tc", "-n", c, "qdisc", "add", "dev", port, "root", *_tbf(self.inter_mbit)])
                _run(["tc", "-n", n, "qdisc", "add", "dev", "lo", "root", *_tbf(self.intra_mbit)])
        except BaseException:
            self.close()
            raise
        return self

    def close(self):
        """Kills every process in the run's namespaces, then deletes them
        (and so their links and qdiscs). Idempotent; only this run's names."""
        if self.closed:
            return
        self.closed = True
        for ns in reversed(self.created):
            for sig in (signal.SIGTERM, signal.SIGKILL):
                pids = self._pids(ns)
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, sig)
                deadline = time.monotonic() + 5
                while pids and time.monotonic() < deadline:
                    pids = [p for p in pids if _alive(p)]
                    time.sleep(0.05)
        errors = []
        for ns in reversed(self.created):
            r = _run(["ip", "netns", "del", ns], check=False)
            if r.returncode != 0:
                errors.append(f"{ns}: {r.stderr.strip()}")
        left = _existing_namespaces().intersection(self.created)
        with Tiers._lock:
            Tiers._live.discard(self)
        if left or errors:
            raise NetnsError(f"namespaces left behind: {sorted(left)} {errors}")

    def _pids(self, ns):
        r = _run(["ip", "netns", "pids", ns], check=False)
        return [int(p) for p in r.stdout.split() if p.isdigit() and int(p) != os.getpid()]

    def check_clean(self):
        """Raises unless every namespace of the run is gone."""
        left = _existing_namespaces().intersection(self.created)
        if left:
            raise NetnsError(f"namespaces left behind: {sorted(left)}")

    # ---- measuring a link
    def bulk_mbit(self, src, dst, nbytes=24 << 20, timeout=30):
        """Throughput of one TCP bulk transfer of nbytes from node src to
        node dst (Mbit/s), measured by the receiver from first to last byte."""
        server = subprocess.Popen(
            [*self.exec_prefix(self.node_ns(dst)), sys.executable, os.path.abspath(__file__), "_sink",
             self.node_addr(dst), str(nbytes)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            port = server.stdout.readline().strip()
            if not port.isdigit():
                raise NetnsError(f"bulk receiver did not start: {server.stderr.read()}")
            _run([*self.exec_prefix(self.node_ns(src)), sys.executable, os.path.abspath(__file__), "_source",
                  self.node_addr(dst), port, str(nbytes)], timeout=timeout)
            out, err = server.communicate(timeout=timeout)
            if server.returncode != 0:
                raise NetnsError(f"bulk receiver failed: {err}")
            return float(out.strip())
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False


def _close_all():
    with Tiers._lock:
        live = list(Tiers._live)
    for t in live:
        with contextlib.suppress(Exception):
            t.close()


_handlers_installed = False


def _install_handlers():
    """At exit and on TERM/INT/HUP (main thread only) the live runs are
    closed; a signal then ends the process as it would have."""
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(_close_all)
    if threading.current_thread() is not threading.main_thread():
        return

    def on_signal(sig, _frame):
        _close_all()
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)


def _sink(addr, nbytes):
    s = socket.socket()
    s.bind((addr, 0))
    s.listen(1)
    s.settimeout(30)
    print(s.getsockname()[1], flush=True)
    conn, _ = s.accept()
    conn.settimeout(30)
    got, start = 0, None
    buf = bytearray(1 << 20)
    while got < nbytes:
        n = conn.recv_into(buf)
        if n == 0:
            break
        if start is None:
            start = time.monotonic()
        got += n
    elapsed = time.monotonic() - start
    conn.sendall(b"k")
    if got < nbytes:
        sys.exit(f"received {got} of {nbytes} bytes")
    print(f"{got * 8 / elapsed / 1e6:.1f}")


def _source(addr, port, nbytes):
    s = socket.create_connection((addr, int(port)), timeout=30)
    chunk = b"\0" * (1 << 20)
    sent = 0
    while sent < nbytes:
        n = min(len(chunk), nbytes - sent)
        s.sendall(chunk[:n])
        sent += n
    s.recv(1)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "_sink":
        _sink(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) >= 2 and sys.argv[1] == "_source":
        _source(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit("usage: import netns (tests/netns/netns_sft_test.py)")
