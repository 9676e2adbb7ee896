#!/usr/bin/env python3
"""An independent reader of TensorBoard event files, written from the
format description (no TensorFlow, no protobuf library): TFRecord framing
(uint64 little-endian length, masked CRC-32C of the length bytes, the data,
masked CRC-32C of the data; mask = rotate right 15 bits + 0xa282ead8) around
tensorflow.Event protos (wall_time=1 double, step=2 int64, file_version=3
string, summary=5: Summary{value=1: Value{tag=1 string, simple_value=2
float}}), parsed by hand from the protobuf wire format.

usage: tfevents_read.py RUN_DIR
Checks: exactly one events.out.tfevents.* file; every CRC; the first
record is file_version "brain.Event:2"; the last value per (tag, step)
equals metrics.jsonl flattened the same way (top-level numbers by key,
numbers in nested maps as "map/key", float32 precision), the (tag, step)
sets are equal, and each event's wall_time is its step's wall_time.
"""
import glob
import json
import math
import os
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def records(blob):
    pos = 0
    while pos < len(blob):
        if len(blob) - pos < 12:
            raise ValueError(f"truncated record header at byte {pos}")
        header = blob[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", blob[pos + 8:pos + 12])
        if masked(crc32c(header)) != length_crc:
            raise ValueError(f"length CRC mismatch at byte {pos}")
        data = blob[pos + 12:pos + 12 + length]
        if len(data) != length or len(blob) < pos + 16 + length:
            raise ValueError(f"truncated record at byte {pos}")
        (data_crc,) = struct.unpack("<I", blob[pos + 12 + length:pos + 16 + length])
        if masked(crc32c(data)) != data_crc:
            raise ValueError(f"data CRC mismatch at byte {pos}")
        yield data
        pos += 16 + length


def varint(buf, pos):
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, pos


def fields(buf):
    """(field number, wire type, value) for each field of a message."""
    pos = 0
    while pos < len(buf):
        key, pos = varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            n, pos = varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unexpected wire type {wire}")
        yield field, wire, value


def parse_event(buf):
    event = {"wall_time": 0.0, "step": 0, "file_version": None, "values": []}
    for field, wire, value in fields(buf):
        if field == 1 and wire == 1:
            event["wall_time"] = struct.unpack("<d", value)[0]
        elif field == 2 and wire == 0:
            event["step"] = value - (1 << 64) if value >= 1 << 63 else value
        elif field == 3 and wire == 2:
            event["file_version"] = value.decode()
        elif field == 5 and wire == 2:
            for f, w, v in fields(value):
                if f != 1 or w != 2:
                    continue
                tag, simple = None, None
                for vf, vw, vv in fields(v):
                    if vf == 1 and vw == 2:
                        tag = vv.decode()
                    elif vf == 2 and vw == 5:
                        simple = struct.unpack("<f", vv)[0]
                event["values"].append((tag, simple))
    return event


def flatten(obj):
    out = {}
    for k, v in obj.items():
        if k in ("step", "wall_time") or isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            out[k] = float(v)
        elif isinstance(v, dict):
            for sk, sv in v.items():
                if isinstance(sv, (int, float)) and not isinstance(sv, bool):
                    out[f"{k}/{sk}"] = float(sv)
    return out


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def main():
    run = sys.argv[1]
    files = glob.glob(os.path.join(run, "events.out.tfevents.*"))
    if len(files) != 1:
        sys.exit(f"tfevents_read: want one event file in {run}, found {files}")
    with open(files[0], "rb") as f:
        events = [parse_event(r) for r in records(f.read())]
    if not events or events[0]["file_version"] != "brain.Event:2":
        sys.exit(f"tfevents_read: first record is not file_version brain.Event:2: {events[:1]}")
    last, wall = {}, {}
    for e in events[1:]:
        for tag, value in e["values"]:
            last[(tag, e["step"])] = value
        wall.setdefault(e["step"], set()).add(e["wall_time"])
    want, want_wall = {}, {}
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            if line.strip():
                obj = json.loads(line)
                for tag, value in flatten(obj).items():
                    want[(tag, obj["step"])] = value
                want_wall[obj["step"]] = obj.get("wall_time")
    errors = []
    for key in sorted(set(want) | set(last), key=str):
        if key not in last:
            errors.append(f"{key}: in metrics.jsonl ({want[key]}), not in the event file")
        elif key not in want:
            errors.append(f"{key}: in the event file ({last[key]}), not in metrics.jsonl")
        elif not (last[key] == f32(want[key]) or (math.isnan(last[key]) and math.isnan(want[key]))):
            errors.append(f"{key}: event file {last[key]!r}, metrics.jsonl {want[key]!r} (float32 {f32(want[key])!r})")
    for step, times in wall.items():
        if want_wall.get(step) is not None and times != {want_wall[step]}:
            errors.append(f"step {step}: wall_time {sorted(times)}, metrics.jsonl {want_wall[step]}")
    for e in errors[:20]:
        print("tfevents_read:", e, file=sys.stderr)
    steps = sorted({s for _, s in want})
    print(f"{os.path.basename(files[0])}: {len(events)} records, {len(last)} scalars over {len(steps)} steps "
          f"({steps[0] if steps else '-'}..{steps[-1] if steps else '-'}), {len({t for t, _ in last})} tags",
          file=sys.stderr)
    sys.exit(1 if errors or not want else 0)


if __name__ == "__main__":
    main()
