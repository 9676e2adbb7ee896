#!/usr/bin/python3
"""deploy/k8s agrees with the images (deploy/docker) and the programs.

Renders every kustomization under deploy/k8s with `kubectl kustomize` and
checks each container of each workload:
  - its image is one of deploy/docker/*.Dockerfile (the name in the file's
    own `docker build ... -t NAME` line), its command a program that image
    installs, and runAsUser/runAsGroup the image's USER;
  - every flag in command/args is one the real program lists in --help (and
    the image's ENTRYPOINT/CMD flags too), every $(VAR) is in the env;
  - --device matches the image (CUDA build or not) and the GPU request;
    --threads matches the CPU request;
  - token files sit on the tandem-tokens Secret (key admin or join as the
    flag needs), the state dir on a ReadWriteOnce claim of a single-replica
    Recreate Deployment, the runs dir on a ReadWriteMany claim that every
    worker mounts at the same path;
  - container ports are the ports in --listen/--metrics-listen and the image
    EXPOSEs them, probes and Services point at them, the workers' --coordinator
    is that Service's gRPC port.
A self-check: the same checks on the CPU kustomization with --device=cuda
must fail. Then it starts the real coordinator with the manifest's flags
(paths moved under a temporary root, addresses to 127.0.0.1 with ephemeral
ports), GETs every httpGet probe path, calls grpc.health.v1 for every grpc
probe, and starts a real worker with each manifest's flags, which must register IDLE
with the right device (a CUDA worker only where a GPU and a CUDA build are;
the test says so otherwise).

Needs kubectl (Debian: kubernetes-client), python3-yaml, python3-grpcio and
python3-protobuf; fails and names the package otherwise. Environment:
TANDEMCTL, TANDEM_COORDINATOR_BIN, TANDEM_WORKER_BIN, TANDEM_PY_GEN (set by
tests/deploy/CMakeLists.txt).
"""
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INSTALL_HINT = "deploy/install-deps.sh --for-tests"
PROGRAMS = ("tandem-coordinator", "tandem-worker", "tandemctl")
SECRET = "tandem-tokens"
# Which Secret key each token flag must read.
TOKEN_FLAGS = {
    ("tandem-coordinator", "--admin-token-file"): "admin",
    ("tandem-coordinator", "--join-token-file"): "join",
    ("tandem-worker", "--token-file"): "join",
}

errors = []


def require(ok, what, package):
    if not ok:
        print(f"FAIL: {what}: install {package}: {INSTALL_HINT}", file=sys.stderr)
        sys.exit(1)


def check(cond, msg):
    if not cond:
        errors.append(msg)
    return cond


for module, package in (("yaml", "python3-yaml"), ("grpc", "python3-grpcio"), ("google.protobuf", "python3-protobuf")):
    try:
        __import__(module)
    except ImportError:
        require(False, f"/usr/bin/python3 cannot import {module}", package)
import yaml  # noqa: E402
require(shutil.which("kubectl") is not None, "kubectl not found", "kubernetes-client")
BINS = {p: os.environ[v] for p, v in (("tandem-coordinator", "TANDEM_COORDINATOR_BIN"),
                                        ("tandem-worker", "TANDEM_WORKER_BIN"), ("tandemctl", "TANDEMCTL"))}
PY_GEN = os.environ["TANDEM_PY_GEN"]


# ---- images -------------------------------------------------------------

def dockerfile_instructions(path):
    """(INSTRUCTION, text) pairs; continuation lines joined, comments dropped."""
    out, cur = [], ""
    for line in open(path):
        s = line.rstrip("\n")
        if not cur and (not s.strip() or s.lstrip().startswith("#")):
            continue
        if s.lstrip().startswith("#"):
            continue  # a comment inside a continued RUN
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        cur += s
        word, _, rest = cur.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        cur = ""
    return out


def load_image(path):
    text = open(path).read()
    m = re.search(r"docker build -f (\S+) -t ([\w./-]+)(?::[\w.-]+)? \.", text)
    check(m is not None, f"{path}: no `docker build -f ... -t NAME .` line naming the image")
    check(m is None or m.group(1) == os.path.relpath(path, ROOT), f"{path}: its build line names {m and m.group(1)}")
    stages = []  # each: list of (instr, text)
    for instr, rest in dockerfile_instructions(path):
        if instr == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instr, rest))
    runtime = stages[-1]
    img = {"path": os.path.relpath(path, ROOT), "name": m.group(2) if m else None,
           "user": None, "entrypoint": None, "cmd": [], "expose": set(), "programs": set()}
    cuda = re.findall(r"-DTANDEM_ENABLE_CUDA=(ON|OFF)", text)
    check(len(set(cuda)) == 1, f"{path}: sets TANDEM_ENABLE_CUDA {cuda or 'nowhere'} (need exactly one value)")
    img["device"] = "cuda" if cuda and cuda[0] == "ON" else "cpu"
    for instr, rest in runtime:
        if instr == "USER":
            img["user"] = rest
        elif instr == "ENTRYPOINT":
            img["entrypoint"] = json.loads(rest)
        elif instr == "CMD":
            img["cmd"] = json.loads(rest)
        elif instr == "EXPOSE":
            img["expose"] |= {int(p.split("/")[0]) for p in rest.split()}
    copies_bin = any(i == "COPY" and re.search(r"/out/bin/ /usr/local/bin/$", r) for i, r in runtime)
    check(copies_bin, f"{path}: the runtime stage does not copy /out/bin/ to /usr/local/bin/")
    for p in PROGRAMS:
        # Some stage puts the program into /out/bin (cp build/bin/P or COPY prebuilt/P).
        if re.search(rf"(build|prebuilt)/(bin/)?{p}\b.*?/out/bin/", text, re.S):
            img["programs"].add(p)
    check(img["programs"] == set(PROGRAMS), f"{path}: installs {sorted(img['programs'])}, not all of {PROGRAMS}")
    check(img["user"] is not None and re.fullmatch(r"\d+:\d+", img["user"] or ""),
          f"{path}: runtime USER {img['user']} is not numeric uid:gid")
    return img


IMAGES = {}
for f in sorted(os.listdir(os.path.join(ROOT, "deploy/docker"))):
    if f.endswith("Dockerfile"):
        img = load_image(os.path.join(ROOT, "deploy/docker", f))
        if img["name"]:
            check(img["name"] not in IMAGES, f"two Dockerfiles build {img['name']}")
            IMAGES[img["name"]] = img
check({i["device"] for i in IMAGES.values()} == {"cpu", "cuda"},
      f"want a CPU and a CUDA image definition, have {[(n, i['device']) for n, i in IMAGES.items()]}")


# ---- programs' flags ----------------------------------------------------

HELP_FLAGS = {"tandemctl": set()}  # no container runs tandemctl
for prog, path in BINS.items():
    if prog == "tandemctl":
        continue
    out = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=30)
    HELP_FLAGS[prog] = set(re.findall(r"^\s+(--[a-z][a-z0-9-]*)", out.stdout + out.stderr, re.M))
    check(len(HELP_FLAGS[prog]) > 3, f"{prog} --help lists no flags")


def parse_flags(args):
    """[(flag, value or None)] from ['--a=b', '--c', 'd', '--e']."""
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
            out.append((k, v))
        elif a.startswith("--"):
            v = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
            out.append((a, v))
            i += 1 if v is not None else 0
        else:
            out.append((None, a))
        i += 1
    return out


for name, img in IMAGES.items():
    ep = img["entrypoint"] or []
    prog = os.path.basename(ep[0]) if ep else None
    if check(prog in PROGRAMS, f"{img['path']}: ENTRYPOINT {ep} is not one of {PROGRAMS}"):
        for flag, _ in parse_flags(ep[1:] + img["cmd"]):
            check(flag in HELP_FLAGS[prog], f"{img['path']}: ENTRYPOINT/CMD flag {flag} is not in {prog} --help")
        for flag, value in parse_flags(img["cmd"]):
            if flag in ("--listen", "--metrics-listen"):
                check(int(value.rsplit(":", 1)[1]) in img["expose"],
                      f"{img['path']}: CMD {flag}={value} but EXPOSE {sorted(img['expose'])}")


# ---- manifests ----------------------------------------------------------

def render(dirpath):
    out = subprocess.run(["kubectl", "kustomize", dirpath], capture_output=True, text=True, timeout=60)
    check(out.returncode == 0, f"kubectl kustomize {dirpath}: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def cpu_quantity(q):
    q = str(q)
    return int(q[:-1]) / 1000 if q.endswith("m") else float(q)


def under(path, mount):
    return path == mount or path.startswith(mount.rstrip("/") + "/")


def check_variant(variant, docs):
    """Static checks; returns what the live checks need."""
    where = f"deploy/k8s/{variant}"
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    claims = by_kind.get("PersistentVolumeClaim", {})
    services = by_kind.get("Service", {})
    live = {"coordinator": None, "workers": []}
    coord_ports = {}
    runs_mounts = []  # (claim, mountPath, kind) per container with a runs claim
    for kind in ("Deployment", "StatefulSet"):
        for wname, w in by_kind.get(kind, {}).items():
            pod = w["spec"]["template"]["spec"]
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            psc = pod.get("securityContext", {})
            for c in pod["containers"]:
                at = f"{where}: {kind} {wname} container {c['name']}"
                image = c["image"].split(":")[0]
                img = IMAGES.get(image)
                if not check(img is not None, f"{at}: image {c['image']} is built by no deploy/docker Dockerfile"):
                    continue
                cmd = c.get("command") or img["entrypoint"]
                prog = os.path.basename(cmd[0])
                check(cmd[0] == f"/usr/local/bin/{prog}" and prog in img["programs"],
                      f"{at}: command {cmd[0]} is not a program {img['path']} installs in /usr/local/bin")
                uid, gid = img["user"].split(":")
                sc = {**psc, **c.get("securityContext", {})}
                check(str(sc.get("runAsUser")) == uid and str(sc.get("runAsGroup")) == gid,
                      f"{at}: runs as {sc.get('runAsUser')}:{sc.get('runAsGroup')}, the image as {img['user']}")
                args = list(cmd[1:]) + list(c.get("args") if c.get("command") else c.get("args", img["cmd"]))
                env = {e["name"] for e in c.get("env", [])}
                for a in args:
                    for var in re.findall(r"\$\((\w+)\)", a):
                        check(var in env, f"{at}: {a} uses $({var}), which is not in its env")
                flags = parse_flags(args)
                fmap = {}
                for flag, value in flags:
                    check(flag is not None, f"{at}: stray argument {value}")
                    if flag is None:
                        continue
                    check(flag in HELP_FLAGS[prog], f"{at}: {flag} is not in {prog} --help")
                    fmap[flag] = value
                mounts = c.get("volumeMounts", [])

                def mount_of(path):
                    best = None
                    for m in mounts:
                        if under(path, m["mountPath"]) and (best is None or len(m["mountPath"]) > len(best["mountPath"])):
                            best = m
                    return best, (volumes.get(best["name"]) if best else None)

                res = c.get("resources", {})
                gpus = int(res.get("limits", {}).get("nvidia.com/gpu", 0))
                if prog == "tandem-worker":
                    dev = fmap.get("--device", "cpu")
                    check(dev == img["device"], f"{at}: --device={dev} on {img['path']}, a {img['device']} build")
                    check((gpus >= 1) == (dev == "cuda"), f"{at}: --device={dev} with {gpus} nvidia.com/gpu")
                    if "--threads" in fmap and "cpu" in res.get("requests", {}):
                        check(float(fmap["--threads"]) == cpu_quantity(res["requests"]["cpu"]),
                              f"{at}: --threads={fmap['--threads']} but requests cpu {res['requests']['cpu']}")
                    check(not c.get("ports"), f"{at}: declares ports, but a worker listens on none of its own")
                for flag, value in flags:
                    key = TOKEN_FLAGS.get((prog, flag))
                    if key is None:
                        continue
                    m, v = mount_of(value)
                    ok = check(v is not None and "secret" in v, f"{at}: {flag}={value} is on no Secret volume")
                    if ok:
                        check(v["secret"]["secretName"] == SECRET, f"{at}: {flag} reads Secret {v['secret']['secretName']}")
                        items = {i["path"]: i["key"] for i in v["secret"].get("items", [])}
                        rel = os.path.relpath(value, m["mountPath"])
                        check(items.get(rel, rel) == key, f"{at}: {flag}={value} reads key {items.get(rel, rel)}, not {key}")
                if "--state-dir" in fmap:
                    m, v = mount_of(fmap["--state-dir"])
                    if check(v is not None and "persistentVolumeClaim" in v,
                             f"{at}: --state-dir={fmap['--state-dir']} is on no PersistentVolumeClaim"):
                        claim = claims.get(v["persistentVolumeClaim"]["claimName"])
                        check(claim is not None and claim["spec"]["accessModes"] == ["ReadWriteOnce"],
                              f"{at}: the state claim is not a ReadWriteOnce claim of this kustomization")
                    check(kind == "Deployment" and w["spec"].get("replicas") == 1
                          and w["spec"].get("strategy", {}).get("type") == "Recreate",
                          f"{at}: a state dir needs one replica and strategy Recreate (never two pods on it)")
                    check(not m.get("readOnly"), f"{at}: the state volume is mounted read-only")
                if "--runs-dir" in fmap:
                    m, v = mount_of(fmap["--runs-dir"])
                    if check(v is not None and "persistentVolumeClaim" in v,
                             f"{at}: --runs-dir={fmap['--runs-dir']} is on no PersistentVolumeClaim"):
                        runs_mounts.append((v["persistentVolumeClaim"]["claimName"], m["mountPath"], "coordinator"))
                if prog == "tandem-worker":
                    for m in mounts:
                        v = volumes.get(m["name"], {})
                        if "persistentVolumeClaim" in v:
                            runs_mounts.append((v["persistentVolumeClaim"]["claimName"], m["mountPath"], "worker"))
                ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
                if prog == "tandem-coordinator":
                    for flag, pname in (("--listen", "grpc"), ("--metrics-listen", "metrics")):
                        if check(flag in fmap, f"{at}: no {flag}"):
                            host, port = fmap[flag].rsplit(":", 1)
                            check(host == "0.0.0.0", f"{at}: {flag}={fmap[flag]} is not reachable from the pod network")
                            check(ports.get(pname) == int(port), f"{at}: containerPort {pname} is "
                                  f"{ports.get(pname)}, {flag} says {port}")
                            check(int(port) in img["expose"], f"{at}: {img['path']} does not EXPOSE {port}")
                    coord_ports = ports
                    probes = []
                    for pk in ("livenessProbe", "readinessProbe", "startupProbe"):
                        p = c.get(pk)
                        if not p:
                            continue
                        if "grpc" in p:
                            check(p["grpc"]["port"] == ports.get("grpc"), f"{at}: {pk} grpc port {p['grpc']['port']} "
                                  f"is not the gRPC port {ports.get('grpc')}")
                            probes.append((pk, "grpc", None))
                        elif "httpGet" in p:
                            port = p["httpGet"]["port"]
                            port = ports.get(port) if isinstance(port, str) else port
                            check(port == ports.get("metrics"), f"{at}: {pk} httpGet port is not the HTTP port")
                            probes.append((pk, "http", p["httpGet"]["path"]))
                        else:
                            check(False, f"{at}: {pk} is neither grpc nor httpGet")
                    check(len(probes) >= 2, f"{at}: fewer than two probes")
                    live["coordinator"] = {"args": args, "probes": probes, "mounts": mounts}
                elif prog == "tandem-worker":
                    live["workers"].append({"at": at, "args": args, "device": img["device"], "env": c.get("env", [])})
    # Services point at declared container ports; workers dial the coordinator Service.
    svc = services.get("tandem-coordinator")
    if check(svc is not None, f"{where}: no Service tandem-coordinator"):
        sports = {}
        for p in svc["spec"]["ports"]:
            tp = p.get("targetPort", p["port"])
            check((tp in coord_ports) if isinstance(tp, str) else (tp in coord_ports.values()),
                  f"{where}: Service port {p['name']} targets {tp}, which the coordinator does not declare")
            sports[p["port"]] = coord_ports.get(tp) if isinstance(tp, str) else tp
        for w in live["workers"]:
            coord = dict(parse_flags(w["args"])).get("--coordinator", "")
            host, _, port = coord.rpartition(":")
            check(host == "tandem-coordinator" and sports.get(int(port or 0)) == coord_ports.get("grpc"),
                  f"{w['at']}: --coordinator={coord} is not the coordinator Service's gRPC port")
    # The runs dir: one ReadWriteMany claim, at the same path in the coordinator and every worker.
    coord_runs = [(c, m) for c, m, k in runs_mounts if k == "coordinator"]
    if check(len(coord_runs) == 1, f"{where}: the coordinator has no --runs-dir on a claim"):
        claim, path = coord_runs[0]
        cl = claims.get(claim)
        check(cl is not None and cl["spec"]["accessModes"] == ["ReadWriteMany"],
              f"{where}: the runs claim {claim} is not ReadWriteMany")
        for w in live["workers"]:
            check((claim, path, "worker") in runs_mounts, f"{w['at']}: does not mount {claim} at {path}")
    return live


# ---- live checks ----------------------------------------------------------

def start_coordinator(tmp, spec):
    """The real coordinator with the manifest's flags: paths under tmp, 127.0.0.1:0."""
    args = []
    for flag, value in parse_flags(spec["args"]):
        if flag in ("--listen", "--metrics-listen"):
            value = "127.0.0.1:0"
        elif value and value.startswith("/"):
            value = tmp + value
        args.append(f"{flag}={value}" if value is not None else flag)
    for m in spec["mounts"]:
        os.makedirs(tmp + m["mountPath"], exist_ok=True)
    tokens = {"admin": os.urandom(32).hex(), "join": os.urandom(32).hex()}
    for key, value in tokens.items():
        path = f"{tmp}/etc/tandem/tokens/{key}"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o400), "w") as f:
            f.write(value)
    out = open(f"{tmp}/coordinator.out", "w+")
    proc = subprocess.Popen([BINS["tandem-coordinator"]] + args, stdout=out,
                            stderr=open(f"{tmp}/coordinator.log", "w"), start_new_session=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        out.seek(0)
        m = re.search(r"^tandem-coordinator listening grpc=(\S+) metrics=(\S+)", out.read(), re.M)
        if m:
            return proc, m.group(1), m.group(2)
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    print(open(f"{tmp}/coordinator.log").read()[-3000:], file=sys.stderr)
    raise SystemExit(f"FAIL: the coordinator with the manifest's flags did not start: {args}")


def stop(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def cuda_here():
    """A GPU (nvidia-smi lists one) and a worker built with CUDA."""
    if shutil.which("nvidia-smi") is None:
        return False
    gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    ldd = subprocess.run(["ldd", BINS["tandem-worker"]], capture_output=True, text=True, timeout=30)
    return gpus.returncode == 0 and "GPU" in gpus.stdout and "libcudart" in ldd.stdout


def live_checks(variant, spec):
    tmp = tempfile.mkdtemp(prefix=f"tandem-k8s-{variant}.")
    procs = []
    try:
        coord, grpc_addr, http_addr = start_coordinator(tmp, spec["coordinator"])
        procs.append(coord)
        for pk, kind, path in spec["coordinator"]["probes"]:
            if kind == "http":
                try:
                    code = urllib.request.urlopen(f"http://{http_addr}{path}", timeout=10).status
                except Exception as e:  # noqa: BLE001 - any failure is the finding
                    code = e
                check(code == 200, f"deploy/k8s/{variant}: {pk} GET {path} answered {code}")
            else:
                r = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tests/python/health_check.py"), grpc_addr],
                                   env={**os.environ, "TANDEM_PY_GEN": PY_GEN}, capture_output=True, text=True,
                                   timeout=30)
                check(r.returncode == 0, f"deploy/k8s/{variant}: {pk} grpc health: {r.stdout}{r.stderr}")
        for i, w in enumerate(spec["workers"]):
            if w["device"] == "cuda" and not cuda_here():
                print(f"{variant}: worker with the manifest's flags not started: no CUDA device or CUDA build "
                      "here (its flags were checked against --help)")
                continue
            pod = f"tandem-worker-{i}"
            env_values = {"POD_NAME": pod, "POD_IP": "127.0.0.1"}
            args = []
            for flag, value in parse_flags(w["args"]):
                value = re.sub(r"\$\((\w+)\)", lambda m: env_values[m.group(1)], value) if value else value
                if flag == "--coordinator":
                    value = grpc_addr
                elif flag == "--threads":
                    value = "1"  # the manifest's count need not exist here
                elif value and value.startswith("/"):
                    value = tmp + value
                args.append(f"{flag}={value}" if value is not None else flag)
            procs.append(subprocess.Popen([BINS["tandem-worker"]] + args, stdout=open(f"{tmp}/{pod}.log", "w"),
                                          stderr=subprocess.STDOUT, start_new_session=True))
            deadline, state = time.time() + 30, None
            while time.time() < deadline and state is None:
                r = subprocess.run([BINS["tandemctl"], "--coordinator", grpc_addr, "--token-file",
                                    f"{tmp}/etc/tandem/tokens/admin", "--output", "json", "workers"],
                                   capture_output=True, text=True, timeout=20)
                for line in r.stdout.splitlines():
                    wk = json.loads(line)
                    if wk.get("name") == pod and wk.get("state") == "WORKER_STATE_IDLE":
                        state = wk
                time.sleep(0.2)
            if check(state is not None, f"{w['at']}: a worker with its flags did not register IDLE in 30 s "
                     f"(log: {open(f'{tmp}/{pod}.log').read()[-1500:]})"):
                device = str(state.get("device", "")).lower().replace("device_kind_", "")
                check(device == w["device"], f"{w['at']}: registered with device {state.get('device')}")
            print(f"{variant}: worker {pod} with the manifest's flags registered IDLE ({w['device']})")
        print(f"{variant}: coordinator with the manifest's flags serves grpc {grpc_addr}, http {http_addr}; "
              f"probes {[(p[0], p[2] or 'grpc') for p in spec['coordinator']['probes']]} answer")
    finally:
        for p in reversed(procs):
            stop(p)
        if not errors:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}", file=sys.stderr)


def self_check(docs):
    """The checks notice a CUDA device flag on the CPU image's workers."""
    global errors
    saved, errors = errors, []
    mutated = copy.deepcopy(docs)
    for d in mutated:
        if d["kind"] == "StatefulSet":
            for c in d["spec"]["template"]["spec"]["containers"]:
                c["args"] = [a.replace("--device=cpu", "--device=cuda") for a in c.get("args", [])]
    check_variant("cpu with --device=cuda", mutated)
    found = [e for e in errors if "--device=cuda on deploy/docker/cpu.Dockerfile" in e]
    errors = saved
    check(bool(found), "self-check: --device=cuda on the CPU image's workers went unnoticed")


def main():
    k8s = os.path.join(ROOT, "deploy/k8s")
    variants = sorted(d for d in os.listdir(k8s) if os.path.isfile(os.path.join(k8s, d, "kustomization.yaml")))
    check({"cpu", "cuda"} <= set(variants), f"deploy/k8s has kustomizations {variants}, want cpu and cuda")
    seen_devices = set()
    for v in variants:
        docs = render(os.path.join(k8s, v))
        spec = check_variant(v, docs)
        if v == "cpu":
            self_check(docs)
        seen_devices |= {w["device"] for w in spec["workers"]}
        if spec["coordinator"] is not None and not errors:
            live_checks(v, spec)
    check(seen_devices == {"cpu", "cuda"}, f"the manifests' workers use devices {sorted(seen_devices)}")
    if errors:
        for e in errors:
            print("FAIL:", e, file=sys.stderr)
        sys.exit(1)
    print(f"PASS: {variants} agree with {sorted(IMAGES)} and the programs")


if __name__ == "__main__":
    main()
