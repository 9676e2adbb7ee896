#!/usr/bin/python3
"""tandemctl plan against real jobs: a coordinator and 4 tandem-worker
processes on this machine, declared on 2 nodes (--node a for n0w0, n0w1;
--node b for n1w0, n1w1; the coordinator orders a job's workers by name, so
ranks 0-1 sit on a and 2-3 on b, as configs/topology-2x2.yaml says). One
worker also declares --tier-bandwidth; `tandemctl workers` shows it.

For each variant (flat ZeRO-3, hpZ, hpZ + qwZ, hpZ + qwZ + LoCo,
layer-major with M = 4, stages 0 and 2) one short SFT job on a small model
runs to its end; the per-tier bytes of a step after the first (which also
carries set-up traffic) and before the last (which also evaluates), summed
over ranks by the coordinator (job_tier_sent_<tier>_<kind> of the step
events), are compared with `tandemctl plan --json` for the same job and
topology: every kind within 5%, and the tier totals within 5%. Prints the
agreement table (the one in docs/parallelism.md).

Then bad topology files and --tier-bandwidth values, each with a clear
error (exit 2). Standard library only.
Usage: plan_test.py --bin BUILD/bin
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
import cluster  # noqa: E402

SPEC = """name: plan-{name}
kind: sft
seed: 7
model:
  config:
    vocab_size: 99
    hidden_size: 64
    intermediate_size: 172
    num_hidden_layers: 2
    num_attention_heads: 4
    num_key_value_heads: 2
    max_position_embeddings: 32
    tokenizer: char
    bos_token_id: 1
    eos_token_id: 2
    pad_token_id: 0
task: {{name: arithmetic, op: add, digits: 1, eval_size: 8}}
train: {{steps: 3, lr: 3.0e-3, global_batch: {batch}, micro_batch: {micro}, warmup_steps: 1, seq_len: 16,
         accumulation: {accumulation}}}
cluster: {{workers: 4, device: cpu, threads_per_worker: 1, zero_stage: {stage}}}
zero: {{hierarchical_partition: {hpz}, weight_quantization: {qwz}, grad_compression: {loco}}}
checkpoint: {{every: 0, keep: 1}}
"""

# name: (label, stage, hpz, qwz, loco, accumulation, global batch, micro batch)
VARIANTS = [
    ("flat", "flat ZeRO-3", 3, "false", "none", "none", "micro_batch", 8, 2),
    ("hpz", "hpZ", 3, "true", "none", "none", "micro_batch", 8, 2),
    ("hpz-qwz", "hpZ + qwZ", 3, "true", "int8", "none", "micro_batch", 8, 2),
    ("hpz-qwz-loco", "hpZ + qwZ + LoCo", 3, "true", "int8", "int4", "micro_batch", 8, 2),
    ("layer-major", "layer-major, M = 4 (ZeRO-3)", 3, "false", "none", "none", "layer_major", 16, 1),
    ("stage0", "ZeRO-0", 0, "false", "none", "none", "micro_batch", 8, 2),
    ("stage2", "ZeRO-2", 2, "false", "none", "none", "micro_batch", 8, 2),
]
TIERS = ("intra_node", "inter_node")
SCALAR_BYTES = 4096  # the step's scalar reductions (loss, tokens, norm), all ranks

TOPOLOGY = "nodes: [{name: a, workers: 2}, {name: b, workers: 2}]\nbandwidth: {intra: 10Gbit, inter: 1Gbit}\n"


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def run(argv, timeout=60):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def plan(ctl, spec, topo, *extra):
    r = run([ctl, "plan", spec, "--topology", topo, "--json", *extra])
    if r.returncode != 0:
        fail(f"tandemctl plan {spec}: exit {r.returncode}: {r.stderr}")
    return json.loads(r.stdout)


def run_job(c, spec):
    r = c.ctl("submit", spec, "--output", "json")
    if r.returncode != 0:
        fail(f"submit {spec}: {r.stdout} {r.stderr}")
    first = json.loads(r.stdout.strip().splitlines()[0])
    job_id = first.get("job_id") or first.get("jobId")
    last = {}

    def ended():
        jobs = c.ctl_json("status", job_id)
        last["job"] = jobs[0] if jobs else {}
        state = last["job"].get("state", "")
        return state if state in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED") else None

    state = cluster.wait_for(ended, 120, f"job {job_id} to end", interval=0.2)
    if state != "JOB_STATE_SUCCEEDED":
        fail(f"{spec}: the job ended {state}: {last.get('job')}")
    ev = c.ctl("--output", "json", "events", job_id, timeout=60)
    if ev.returncode != 0:
        fail(f"tandemctl events {job_id}: {ev.stderr}")
    events = [json.loads(line) for line in ev.stdout.splitlines() if line.strip()]
    steps = sorted((e.get("metrics") or {} for e in events if e.get("kind") == "step"),
                   key=lambda m: int(m.get("step", 0)))
    if len(steps) < 3:
        fail(f"{spec}: {len(steps)} step events, expected 3")
    return steps[1].get("extra") or {}


def compare(label, predicted, measured):
    """Rows of the agreement table; fails on a kind or tier total off by more than 5%."""
    rows = []
    kinds = sorted(set(predicted.get("job_bytes_sent", {})) |
                   {k[len(f"job_tier_sent_{t}_"):] for t in TIERS for k in measured
                    if k.startswith(f"job_tier_sent_{t}_")})
    for tier in TIERS:
        p_total = m_total = 0.0
        for kind in kinds:
            p = float(predicted.get("job_bytes_sent", {}).get(kind, {}).get(tier, 0))
            m = float(measured.get(f"job_tier_sent_{tier}_{kind}", 0))
            p_total += p
            m_total += m
            if p == 0 and m == 0:
                continue
            if p == 0:
                if m > SCALAR_BYTES:
                    fail(f"{label}: {tier} {kind}: measured {m:.0f} bytes, predicted none")
                continue
            if abs(m - p) > 0.05 * p:
                fail(f"{label}: {tier} {kind}: measured {m:.0f} bytes, predicted {p:.0f} ({100 * (m - p) / p:+.1f}%)")
        if abs(m_total - p_total) > 0.05 * p_total + SCALAR_BYTES:
            fail(f"{label}: {tier} total: measured {m_total:.0f}, predicted {p_total:.0f}")
        rows.append((tier, p_total, m_total))
    return rows


def bad_inputs(ctl, worker, root, spec):
    """Bad topology files and --tier-bandwidth values: exit 2 and a clear message."""
    cases = [
        ("nodes: [{name: a, workers: 2}, {name: b, workers: 2}]\nlinks: 3\n", "links: unknown key"),
        ("nodes: [{name: a, workers: 2, gpus: 1}, {name: b, workers: 2}]\n", "nodes[0].gpus: unknown key"),
        ("nodes: [{name: a, workers: 2}, {name: a, workers: 2}]\n", "listed twice"),
        ("nodes: [{name: a, workers: 3}, {name: b, workers: 2}]\n", "the job asks for 4"),
        ("nodes: [{name: a, workers: 1}]\n", "the job asks for 4"),
        ("nodes: [{name: a, workers: 0}, {name: b, workers: 4}]\n", "nodes[0].workers"),
        ("nodes: [{name: a, workers: -2}, {name: b, workers: 6}]\n", "nodes[0].workers"),
        ("nodes: [{name: a, workers: 99999999999}, {name: b, workers: 2}]\n", "nodes[0].workers"),
        ("nodes: [{name: 'a b', workers: 2}, {name: b, workers: 2}]\n", "nodes[0].name"),
        ("nodes: []\n", "nodes: expected a non-empty list"),
        ("bandwidth: {intra: 10Gbit, inter: 1Gbit}\n", "nodes: missing"),
        (TOPOLOGY.replace("inter: 1Gbit", "inter: 0Gbit"), "bandwidth.inter"),
        (TOPOLOGY.replace("inter: 1Gbit", "inter: -1Gbit"), "above zero"),
        (TOPOLOGY.replace("inter: 1Gbit", "inter: 1e30Gbit"), "limit"),
        (TOPOLOGY.replace("inter: 1Gbit", "inter: 1 gigabit"), "bandwidth.inter"),
        (TOPOLOGY.replace("inter: 1Gbit", "inter: 1Gbit, cross: 2Gbit"), "bandwidth.cross: unknown key"),
        ("nodes: [{name: a, workers: 2}\n", "line"),
    ]
    for i, (text, want) in enumerate(cases):
        path = os.path.join(root, f"bad-topology-{i}.yaml")
        with open(path, "w") as f:
            f.write(text)
        r = run([ctl, "plan", spec, "--topology", path, "--json"])
        if r.returncode != 2 or want not in r.stderr:
            fail(f"bad topology {text!r}: exit {r.returncode}, stderr {r.stderr!r} (wanted exit 2 and {want!r})")
    r = run([ctl, "plan", spec])
    if r.returncode != 2 or "--topology" not in r.stderr:
        fail(f"plan without --topology: exit {r.returncode}: {r.stderr}")
    for value, want in [("intra=10Gbit", "missing inter"), ("intra=10Gbit,inter=0Mbit", "above zero"),
                        ("intra=fast,inter=1Gbit", "no unit"), ("intra=10Gbit,inter=1Gbit,wan=1Mbit", "unknown tier")]:
        r = run([worker, "--coordinator", "127.0.0.1:1", "--tier-bandwidth", value], timeout=30)
        if r.returncode != 2 or "tier_bandwidth" not in r.stderr + r.stdout or want not in r.stderr + r.stdout:
            fail(f"tandem-worker --tier-bandwidth {value}: exit {r.returncode}: {r.stderr!r} (wanted {want!r})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    args = ap.parse_args()
    bins = cluster.default_bins(os.path.abspath(args.bin))
    ctl = bins["tandemctl"]
    root = tempfile.mkdtemp(prefix="plan-test-")
    topo = os.path.join(root, "topology.yaml")
    with open(topo, "w") as f:
        f.write(TOPOLOGY)
    specs = {}
    for name, label, stage, hpz, qwz, loco, acc, batch, micro in VARIANTS:
        specs[name] = os.path.join(root, f"{name}.yaml")
        with open(specs[name], "w") as f:
            f.write(SPEC.format(name=name, stage=stage, hpz=hpz, qwz=qwz, loco=loco, accumulation=acc, batch=batch,
                                micro=micro))
    bad_inputs(ctl, bins["worker"], root, specs["flat"])

    c = cluster.Cluster(os.path.join(root, "cluster"), bins=bins)
    table = []
    try:
        c.start_coordinator(timeout=30)
        names = []
        for k, node in enumerate(("a", "b")):
            for j in range(2):
                name = f"n{k}w{j}"
                extra = ["--node", node]
                if name == "n0w0":
                    extra += ["--tier-bandwidth", "intra=10Gbit,inter=1Gbit"]
                c.start_worker(name, extra)
                names.append(name)
        c.wait_workers(names, timeout=60)
        shown = c.workers()
        tb = shown["n0w0"].get("tier_bandwidth") or shown["n0w0"].get("tierBandwidth") or {}
        intra = float(tb.get("intra_bytes_per_s", tb.get("intraBytesPerS", 0)))
        if intra != 1.25e9 or shown["n1w0"].get("tier_bandwidth", shown["n1w0"].get("tierBandwidth")):
            fail(f"tandemctl workers: tier bandwidth {shown['n0w0']} / {shown['n1w0']}")
        text = c.ctl("workers")
        if "10 Gbit/s" not in text.stdout or "1 Gbit/s" not in text.stdout:
            fail(f"tandemctl workers does not show the tier bandwidth:\n{text.stdout}")
        for name, label, *_ in VARIANTS:
            predicted = plan(ctl, specs[name], topo)
            measured = run_job(c, specs[name])
            for tier, p, m in compare(label, predicted, measured):
                table.append((label, tier, p, m))
            print(f"{label}: ok", file=sys.stderr)
    finally:
        c.down()
    print("| variant | tier | predicted bytes per step | measured | difference |")
    print("|---|---|---|---|---|")
    for label, tier, p, m in table:
        diff = f"{100 * (m - p) / p:+.2f}%" if p else "-"
        print(f"| {label} | {tier.replace('_', '-')} | {p:.0f} | {m:.0f} | {diff} |")
    shutil.rmtree(root, ignore_errors=True)
    print("PASS")


if __name__ == "__main__":
    main()
