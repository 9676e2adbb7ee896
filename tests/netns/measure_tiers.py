#!/usr/bin/python3
"""Step time and inter-node bytes per step of ZeRO-3 variants on emulated
tiers (netns.py): 2 nodes x 2 workers, 10 Gbit/s inside a node, 1 Gbit/s
between nodes, an SFT job on the config B model (vocab 4096, hidden 512,
8 layers, 8/4 heads, intermediate 1376; Psi = 27.4 M), micro-batch 1,
global batch 4 (M = 1 pass per rank and step) or 16 (M = 4 passes).
Rows with M = 4 compare with flat ZeRO-3 at M = 4 (ordinary accumulation).

For each variant one job of --steps steps; the first step (which also
carries set-up traffic) and the last (which also runs the evaluation) are
left out of the means. Prints a Markdown table:
step time (the coordinator's wall time of the step's phases) and the job's
inter-node and intra-node bytes sent per step (job_tier_sent_*).

Usage (root): measure_tiers.py --bin BUILD/bin [--steps 5] [--variants flat,hpz,...]
"""
import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import netns  # noqa: E402
import tier_job  # noqa: E402

SPEC = """name: tiers-{name}
kind: sft
seed: 7
model:
  config:
    vocab_size: 4096
    hidden_size: 512
    intermediate_size: 1376
    num_hidden_layers: 8
    num_attention_heads: 8
    num_key_value_heads: 4
    max_position_embeddings: 512
    tokenizer: char
    bos_token_id: 1
    eos_token_id: 2
    pad_token_id: 0
task: {{name: arithmetic, op: add, digits: 3, eval_size: 4}}
train: {{steps: {steps}, lr: 1.0e-4, global_batch: {batch}, micro_batch: 1, warmup_steps: 1, seq_len: 64, eval_every: 1000,
  accumulation: {accumulation}}}
cluster: {{workers: 4, device: cpu, threads_per_worker: 1, zero_stage: 3}}
zero: {{hierarchical_partition: {hpz}, weight_quantization: {qwz}, grad_compression: {loco}}}
checkpoint: {{every: 0, keep: 1}}
"""

# key: (label, hpZ, qwZ, LoCo, accumulation, M passes per rank, the row compared with)
VARIANTS = {
    "flat": ("flat ZeRO-3", "false", "none", "none", "micro_batch", 1, None),
    "hpz": ("hpZ", "true", "none", "none", "micro_batch", 1, "flat"),
    "hpz_qwz": ("hpZ + qwZ", "true", "int8", "none", "micro_batch", 1, "flat"),
    "hpz_qwz_loco": ("hpZ + qwZ + LoCo", "true", "int8", "int4", "micro_batch", 1, "flat"),
    "flat_m4": ("flat ZeRO-3, M = 4", "false", "none", "none", "micro_batch", 4, None),
    "layer_major_m4": ("layer-major, M = 4", "false", "none", "none", "layer_major", 4, "flat_m4"),
    "all_m4": ("hpZ + qwZ + LoCo + layer-major, M = 4", "true", "int8", "int4", "layer_major", 4, "flat_m4"),
}
WORKERS = 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--timeout", type=float, default=240, help="seconds per job")
    args = ap.parse_args()
    for key in args.variants.split(","):
        if key not in VARIANTS:
            sys.exit(f"--variants: unknown variant {key!r} (known: {', '.join(VARIANTS)})")
    netns.require()
    root = tempfile.mkdtemp(prefix="measure-tiers-")
    rows = {}
    with netns.Tiers(nodes=2, intra_mbit=10000, inter_mbit=1000) as tiers:
        inter_mbit = tiers.bulk_mbit(0, 1)
        for key in args.variants.split(","):
            label, hpz, qwz, loco, accumulation, passes, _ = VARIANTS[key]
            spec = os.path.join(root, f"{key}.yaml")
            with open(spec, "w") as f:
                f.write(SPEC.format(name=key.replace("_", "-"), steps=args.steps, hpz=hpz, qwz=qwz, loco=loco,
                                    accumulation=accumulation, batch=WORKERS * passes))
            run = tier_job.run_job(tiers, os.path.abspath(args.bin), spec, per_node=2,
                                   root=os.path.join(root, key), timeout=args.timeout)
            if run["job"].get("state") != "JOB_STATE_SUCCEEDED":
                sys.exit(f"{label}: the job ended {run['job'].get('state')}: {run['job']}")
            steps = tier_job.step_metrics(run["events"])[1:-1]
            if not steps:
                sys.exit(f"{label}: no steps between the first and the last (--steps >= 3)")
            secs = [sum((m.get("phase_seconds") or {}).values()) for m in steps]
            extra = [m.get("extra") or {} for m in steps]
            inter = [float(x.get("job_tier_sent_inter_node", 0)) for x in extra]
            intra = [float(x.get("job_tier_sent_intra_node", 0)) for x in extra]
            loss = float(steps[-1].get("loss", 0))
            rows[key] = (sum(secs) / len(secs), sum(inter) / len(inter), sum(intra) / len(intra), loss)
            print(f"{label}: {rows[key][0]:.2f} s/step, inter {rows[key][1] / 1e6:.1f} MB/step", file=sys.stderr)
    tiers.check_clean()
    print(f"bulk TCP between the emulated nodes: {inter_mbit:.0f} Mbit/s (limit 1000)\n")
    print("| variant | step time (s) | inter-node MB sent per step | vs flat (same M): bytes, time | "
          "intra-node MB sent per step | loss, last measured step |")
    print("|---|---|---|---|---|---|")
    for key, (sec, inter, intra, loss) in rows.items():
        base = rows.get(VARIANTS[key][6]) if VARIANTS[key][6] else None
        ratio = f"{base[1] / inter:.1f}x fewer, {base[0] / sec:.2f}x faster" if base and inter > 0 else "-"
        print(f"| {VARIANTS[key][0]} | {sec:.2f} | {inter / 1e6:.1f} | {ratio} | {intra / 1e6:.1f} | {loss:.4f} |")


if __name__ == "__main__":
    main()
