#!/usr/bin/env python3
"""Long training documents for the sparse-attention quality benchmark.

Each JSONL row is one document of string reversals, "rev:abc=cba;" after
"rev:xyz=zyx;", of about --chars characters: the prompt is the first
example's "rev:...=", the response everything after it. A model trained on
them reverses strings anywhere in a long sequence, which is what
bench_sparse_quality --document text measures.

    make_docs.py --rows 2000 --chars 1000 --seed 1 > docs.jsonl
"""
import argparse
import json
import random
import string


def example(rng, lo, hi):
    s = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(lo, hi)))
    return "rev:" + s + "=", s[::-1] + ";"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--chars", type=int, default=1000)
    ap.add_argument("--min-len", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=24)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.rows < 1 or a.chars < 1 or not 1 <= a.min_len <= a.max_len:
        ap.error("--rows and --chars must be >= 1 and 1 <= --min-len <= --max-len")
    rng = random.Random(a.seed)
    for _ in range(a.rows):
        prompt, answer = example(rng, a.min_len, a.max_len)
        response = answer
        while len(prompt) + len(response) < a.chars:
            p, q = example(rng, a.min_len, a.max_len)
            response += p + q
        print(json.dumps({"prompt": prompt, "response": response}))


if __name__ == "__main__":
    main()
