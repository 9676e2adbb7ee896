#!/usr/bin/python3
"""A short SFT job on emulated tiers: 2 nodes x 2 workers in their own
network namespaces (netns.py), 10 Gbit/s inside a node, 1 Gbit/s between
them. Checks that

  * a failure inside the harness still removes every namespace it made;
  * the inter-node rate limit is in effect (a bulk TCP transfer between
    the nodes runs at 0.3-1.25x the configured rate);
  * the job (ZeRO-3, 4 workers) succeeds and its inter-node byte counter
    (job_tier_sent_inter_node of the step events) is above zero;
  * the same job with hpZ + qwZ + LoCo (zero.hierarchical_partition,
    weight_quantization: int8, grad_compression: int4) succeeds and sends
    under half the inter-node bytes per step (after the first, which also
    carries set-up traffic);
  * every namespace is gone afterwards.

Needs root and iproute2; without them it fails saying so (it never skips).
Usage: netns_sft_test.py --bin BUILD/bin
"""
import argparse
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import netns  # noqa: E402
import tier_job  # noqa: E402

INTRA_MBIT, INTER_MBIT = 10000, 1000

SPEC = """name: netns-sft
kind: sft
seed: 7
model:
  config:
    vocab_size: 99
    hidden_size: 32
    intermediate_size: 64
    num_hidden_layers: 2
    num_attention_heads: 4
    num_key_value_heads: 2
    max_position_embeddings: 64
    tokenizer: char
    bos_token_id: 1
    eos_token_id: 2
    pad_token_id: 0
task: {name: arithmetic, op: add, digits: 1, eval_size: 16}
train: {steps: 3, lr: 3.0e-3, global_batch: 8, micro_batch: 2, warmup_steps: 1, seq_len: 16}
cluster: {workers: 4, device: cpu, threads_per_worker: 1, zero_stage: 3}
checkpoint: {every: 0, keep: 1}
"""
ALL_TECHNIQUES = "zero: {hierarchical_partition: true, weight_quantization: int8, grad_compression: int4}\n"


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def check_cleanup_on_failure():
    t = netns.Tiers(nodes=1)
    try:
        with t:
            raise KeyError("raised inside the harness on purpose")
    except KeyError:
        pass
    t.check_clean()
    if not t.created:
        fail("the cleanup check created no namespace")
    print(f"ok: a failure inside the harness removed {', '.join(t.created)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    args = ap.parse_args()
    try:
        netns.require()
    except netns.NetnsError as e:
        fail(str(e))
    check_cleanup_on_failure()
    root = tempfile.mkdtemp(prefix="netns-sft-")
    spec = os.path.join(root, "job.yaml")
    with open(spec, "w") as f:
        f.write(SPEC)
    spec_all = os.path.join(root, "job-hpz.yaml")
    with open(spec_all, "w") as f:
        f.write(SPEC + ALL_TECHNIQUES)
    tiers = netns.Tiers(nodes=2, intra_mbit=INTRA_MBIT, inter_mbit=INTER_MBIT)
    with tiers:
        mbit = tiers.bulk_mbit(0, 1)
        print(f"bulk transfer node0 -> node1: {mbit:.0f} Mbit/s (limit {INTER_MBIT})")
        if not 0.3 * INTER_MBIT <= mbit <= 1.25 * INTER_MBIT:
            fail(f"inter-node throughput {mbit:.0f} Mbit/s is not within 0.3-1.25x of the {INTER_MBIT} Mbit/s limit")
        runs = {}
        for name, path in (("flat", spec), ("hpZ + qwZ + LoCo", spec_all)):
            runs[name] = tier_job.run_job(tiers, os.path.abspath(args.bin), path, per_node=2,
                                          root=os.path.join(root, f"cluster-{len(runs)}"), timeout=40)
    tiers.check_clean()
    later = {}
    for name, run in runs.items():
        state = run["job"].get("state")
        if state != "JOB_STATE_SUCCEEDED":
            fail(f"the {name} job ended {state}: {run['job']}")
        steps = tier_job.step_metrics(run["events"])
        if len(steps) != 3:
            fail(f"{name}: {len(steps)} step events, expected 3")
        sent = [[float((m.get("extra") or {}).get(f"job_tier_sent_{t}_node", 0)) for m in steps]
                for t in ("inter", "intra")]
        print(f"{name} job succeeded: {len(steps)} steps, inter-node bytes per step {sent[0]}, "
              f"intra-node {sent[1]}")
        if min(sent[0]) <= 0 or min(sent[1]) <= 0:
            fail(f"{name}: the tier byte counters did not count both tiers in every step")
        later[name] = sum(sent[0][1:])
    if not later["hpZ + qwZ + LoCo"] < 0.5 * later["flat"]:
        fail(f"hpZ + qwZ + LoCo sent {later['hpZ + qwZ + LoCo']:.0f} inter-node bytes in steps 2-3, "
             f"flat {later['flat']:.0f}: expected under half")
    print(f"ok: namespaces {tiers.created} removed")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
