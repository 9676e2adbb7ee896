#!/usr/bin/env bash
# `tandemctl checkpoints JOB --output json` against the files on disk: a
# 2-worker SFT job checkpointing every step (written in the background and
# reported with later phases; the last ones with EXPORT). Every listed
# checkpoint must exist, its step must be the one in its manifest.json, and
# its size must be > 0 and equal to the sum of the sizes of the files in its
# step directory (every rank's shard file plus manifest.json; the directory
# holds nothing else, no subdirectories). Every step has its checkpoint listed.
# A coordinator restarted on the same state dir lists the same records.
source "$(dirname "$0")/lib.sh"
JOB="$TI_DIR/jobs/sft-tiny.yaml"
STEPS=4
start_coordinator
start_worker a
start_worker b
wait_until 30 workers_idle_at_least 2 || fail "workers did not register"
ID=$(ctl submit "$JOB" --workers 2 --set name=checkpoint-sizes --set train.steps=$STEPS \
  --set checkpoint.every=1 --set checkpoint.keep=$STEPS)
expect_exit 0 timeout 240 "$TANDEMCTL" --coordinator "$GRPC_ADDR" --token-file "$WORK/admin.token" watch "$ID"
[[ "$(job_state "$ID")" == SUCCEEDED ]] || fail "job is $(job_state "$ID")"

ctl checkpoints "$ID" --output json >"$WORK/checkpoints.json" || fail "tandemctl checkpoints failed"
cat "$WORK/checkpoints.json" >&2
/usr/bin/python3 - "$WORK/checkpoints.json" "$STEPS" <<'PY' || fail "checkpoint records do not match the disk"
import json, os, sys
path, steps = sys.argv[1], int(sys.argv[2])
records = [json.loads(l) for l in open(path) if l.strip()]
ok = True
def bad(msg):
    global ok
    ok = False
    print("checkpoint_sizes:", msg, file=sys.stderr)
seen = []
for r in records:
    step, size, d = int(r["step"]), int(r["bytes"]), r["path"]  # int64 fields are JSON strings
    seen.append(step)
    if not os.path.isdir(d):
        bad(f"step {step}: {d} is not a directory")
        continue
    entries = list(os.scandir(d))
    files = [e for e in entries if e.is_file(follow_symlinks=False)]
    if len(files) != len(entries):
        bad(f"step {step}: {d} holds something other than plain files")
    names = sorted(e.name for e in files)
    on_disk = sum(e.stat(follow_symlinks=False).st_size for e in files)
    manifest = json.load(open(os.path.join(d, "manifest.json")))
    shards = sorted(s["file"] for s in manifest["shards"])
    if names != sorted(shards + ["manifest.json"]):
        bad(f"step {step}: files {names}, manifest lists {shards}")
    if len(shards) != 2:
        bad(f"step {step}: {len(shards)} shards, want 2")
    if manifest["step"] != step:
        bad(f"step {step}: manifest says step {manifest['step']}")
    if size <= 0 or size != on_disk:
        bad(f"step {step}: listed {size} bytes, {on_disk} on disk in {names}")
    print(f"step {step}: {size} bytes = {on_disk} on disk ({', '.join(names)})", file=sys.stderr)
if sorted(seen) != list(range(1, steps + 1)):
    bad(f"listed steps {sorted(seen)}, want 1..{steps}")
sys.exit(0 if ok else 1)
PY
# The table shows a size in every row (a size of 0 prints as "-").
expect_exit 0 ctl checkpoints "$ID"
expect_output "SIZE"
ROWS=$(tail -n +2 "$WORK/out.txt")
[[ $(grep -c . <<<"$ROWS") == "$STEPS" ]] || { cat "$WORK/out.txt" >&2; fail "want $STEPS table rows"; }
if grep -vE " [0-9.]+ (B|KiB|MiB|GiB|TiB) " <<<"$ROWS" >&2; then fail "a table row without a size"; fi

log "SIGKILL coordinator $COORD_PID, restart on the same state dir"
stop_member KILL coordinator
start_coordinator
ctl checkpoints "$ID" --output json >"$WORK/after-restart.json" || fail "tandemctl checkpoints failed after restart"
diff "$WORK/checkpoints.json" "$WORK/after-restart.json" >&2 || fail "checkpoint records changed across the restart"
healthy
log "PASS"
