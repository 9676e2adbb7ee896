#!/usr/bin/python3
"""A RewardService (proto/tandem/v1/reward.proto) in its own process, for tests.

Usage: reward_server.py RECORD_FILE
Serves on 127.0.0.1 (an ephemeral port), prints "listening PORT" once ready,
appends every ScoreRequest it receives to RECORD_FILE as one JSON line
({"job_id", "step", "items": [{prompt, completion, reference,
completion_ids, fields, terminated}, ...]}) and answers, per item,
reward(item) below, so a test can recompute the step's mean reward from the
record. Stops on SIGTERM.
Needs TANDEM_PY_GEN (the Python stubs of tests/python).
"""
import json
import os
import signal
import sys
import threading
from concurrent import futures

sys.path.insert(0, os.environ["TANDEM_PY_GEN"])

import grpc  # noqa: E402
from tandem.v1 import reward_pb2, reward_pb2_grpc  # noqa: E402


def reward(item):
    """1 for a response that ended by itself, plus 0.001 per byte of its text."""
    return (1.0 if item["terminated"] else 0.0) + len(item["completion"].encode()) / 1000


class Recorder(reward_pb2_grpc.RewardServiceServicer):
    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()

    def Score(self, request, context):
        items = [{
            "prompt": it.prompt,
            "completion": it.completion,
            "reference": it.reference,
            "completion_ids": list(it.completion_ids),
            "fields": dict(it.fields),
            "terminated": it.terminated,
        } for it in request.items]
        line = json.dumps({"job_id": request.job_id, "step": request.step, "items": items})
        with self.lock, open(self.path, "a") as f:
            f.write(line + "\n")
        return reward_pb2.ScoreResponse(rewards=[reward(it) for it in items])


def main():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    reward_pb2_grpc.add_RewardServiceServicer_to_server(Recorder(sys.argv[1]), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    print(f"listening {port}", flush=True)
    done.wait(600)  # a test never needs it longer
    server.stop(1).wait(5)


if __name__ == "__main__":
    main()
