#!/usr/bin/env python3
"""Compares two safetensors files tensor by tensor (stdlib only).

Usage: compare_safetensors.py A.safetensors B.safetensors [--max-abs X]

Prints the largest absolute and relative differences and the tensor they are
in; exits 1 when the tensor names or shapes differ or when the largest
absolute difference exceeds --max-abs (default 0: bit-identical).
"""
import argparse
import array
import json
import struct
import sys

DTYPES = {"F32": "f"}


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        sys.exit(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        sys.exit(f"{path}: header length {n} exceeds the file")
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        code = DTYPES.get(info["dtype"])
        if code is None:
            sys.exit(f"{path}: tensor {name}: dtype {info['dtype']} not supported (F32 only)")
        begin, end = info["data_offsets"]
        values = array.array(code)
        values.frombytes(data[base + begin:base + end])
        if sys.byteorder != "little":
            values.byteswap()
        out[name] = (tuple(info["shape"]), values)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--max-abs", type=float, default=0.0)
    args = ap.parse_args()
    a, b = load(args.a), load(args.b)
    if sorted(a) != sorted(b):
        print(f"tensor names differ: {sorted(set(a) ^ set(b))}")
        return 1
    worst_abs, worst_rel, where = 0.0, 0.0, ""
    for name in sorted(a):
        (sa, va), (sb, vb) = a[name], b[name]
        if sa != sb:
            print(f"{name}: shape {sa} vs {sb}")
            return 1
        for x, y in zip(va, vb):
            d = abs(x - y)
            if d > worst_abs:
                worst_abs, where = d, name
            scale = max(abs(x), abs(y))
            if scale > 0:
                worst_rel = max(worst_rel, d / scale)
    print(f"max abs diff {worst_abs:.3g} (in {where or '-'}), max rel diff {worst_rel:.3g}, "
          f"{len(a)} tensors")
    return 0 if worst_abs <= args.max_abs else 1


if __name__ == "__main__":
    sys.exit(main())
