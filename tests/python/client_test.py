#!/usr/bin/python3
"""A second, independent client of tandem-coordinator (Python grpcio).

Starts a real coordinator on 127.0.0.1 (ephemeral ports, fresh tokens) and
calls the Control and Cluster services and grpc.health.v1 with stubs that
protoc generated from our protos, so the wire contract does not depend on
our C++ client. Also sends bad input (bad fields, huge strings, missing or
wrong tokens, a second registration, streams dropped mid-way) and checks the
daemon stays healthy after each. Every wait is bounded.

Environment: TANDEM_PY_GEN (generated stubs), TANDEM_COORDINATOR_BIN,
TANDEM_WORKER_BIN, TANDEMCTL (tests/support/cluster.py).
"""
import os
import shutil
import sys
import tempfile
import time
import unittest
import urllib.request

sys.path.insert(0, os.environ["TANDEM_PY_GEN"])
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))

import cluster as launcher  # noqa: E402  tests/support/cluster.py

import grpc  # noqa: E402
from tandem.v1 import cluster_pb2, cluster_pb2_grpc, control_pb2, control_pb2_grpc, job_pb2  # noqa: E402
from tandem_health import health_pb2, health_pb2_grpc  # noqa: E402

RPC_TIMEOUT = 10


def tiny_spec(name="py-sft", workers=1, steps=3):
    spec = job_pb2.JobSpec(name=name, kind=job_pb2.JOB_KIND_SFT, seed=3)
    c = spec.model.config
    c.vocab_size, c.hidden_size, c.intermediate_size = 99, 32, 64
    c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads = 2, 4, 2
    c.max_position_embeddings, c.tokenizer = 64, "char"
    c.bos_token_id, c.eos_token_id, c.pad_token_id = 1, 2, 0
    spec.task.name, spec.task.op, spec.task.digits = "arithmetic", "add", 1
    spec.train.steps, spec.train.lr = steps, 1e-3
    spec.train.global_batch, spec.train.micro_batch = 2 * workers, 1
    spec.cluster.workers, spec.cluster.device = workers, job_pb2.DEVICE_KIND_CPU
    return spec


class Coordinator:
    """A tandem-coordinator started by the test-cluster launcher
    (tests/support/cluster.py): 127.0.0.1, ephemeral ports, fresh tokens,
    returns once /readyz answers."""

    def __init__(self, workdir):
        self.dir = workdir
        self.cluster = launcher.Cluster(workdir, bins=launcher.default_bins())
        self.cluster.start_coordinator()
        with open(self.cluster.desc["admin_token_file"]) as f:
            self.admin = f.read().strip()
        with open(self.cluster.desc["join_token_file"]) as f:
            self.join = f.read().strip()
        self.grpc_addr = self.cluster.grpc
        self.metrics_addr = self.cluster.metrics
        self.channel = grpc.insecure_channel(self.grpc_addr)
        self.control = control_pb2_grpc.ControlStub(self.channel)
        self.cluster_stub = cluster_pb2_grpc.ClusterStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def running(self):
        return self.cluster.running(launcher.COORDINATOR)

    def stop(self):
        """Stops it; its exit code."""
        self.cluster.down()
        return self.cluster.exit_code(launcher.COORDINATOR)


def md(token):
    return (("authorization", "Bearer " + token),) if token else ()


class ControlContractTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tandem-py-")
        cls.coord = Coordinator(cls.tmp)

    @classmethod
    def tearDownClass(cls):
        rc = cls.coord.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        assert rc is not None

    # -- helpers ---------------------------------------------------------
    def admin(self):
        return md(self.coord.admin)

    def join(self):
        return md(self.coord.join)

    def worker(self, registered):
        """Join token plus the credential a RegisterWorker response carries."""
        return md(self.coord.join) + (("x-tandem-worker-credential", registered.worker_credential),)

    def assertHealthy(self):
        self.assertTrue(self.coord.running(), "coordinator exited")
        resp = self.coord.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=RPC_TIMEOUT)
        self.assertEqual(resp.status, health_pb2.HealthCheckResponse.SERVING)
        if self.coord.metrics_addr:
            with urllib.request.urlopen("http://%s/healthz" % self.coord.metrics_addr, timeout=5) as r:
                self.assertEqual(r.status, 200)

    def assertCode(self, codes, fn, *args, **kwargs):
        if not isinstance(codes, (list, tuple)):
            codes = [codes]
        with self.assertRaises(grpc.RpcError) as cm:
            fn(*args, timeout=RPC_TIMEOUT, **kwargs)
        self.assertIn(cm.exception.code(), codes, cm.exception.details())
        self.assertHealthy()
        return cm.exception

    def register(self, name, credential="", timeout=RPC_TIMEOUT):
        return self.coord.cluster_stub.RegisterWorker(
            cluster_pb2.RegisterWorkerRequest(name=name, host="py-host", device=job_pb2.DEVICE_KIND_CPU,
                                              device_count=1, memory_bytes=1 << 30, version="py",
                                              data_address="127.0.0.1", worker_credential=credential),
            metadata=self.join(), timeout=timeout)

    # -- contract --------------------------------------------------------
    def test_health_services(self):
        self.assertHealthy()
        for svc in ("tandem.v1.Control", "tandem.v1.Cluster"):
            try:
                r = self.coord.health.Check(health_pb2.HealthCheckRequest(service=svc), timeout=RPC_TIMEOUT)
                self.assertEqual(r.status, health_pb2.HealthCheckResponse.SERVING)
            except grpc.RpcError as e:  # per-service status is optional
                self.assertEqual(e.code(), grpc.StatusCode.NOT_FOUND)

    def test_submit_get_list_cancel(self):
        resp = self.coord.control.SubmitJob(control_pb2.SubmitJobRequest(spec=tiny_spec(workers=3)),
                                            metadata=self.admin(), timeout=RPC_TIMEOUT)
        self.assertTrue(resp.job_id)
        # The scheduler states the reason on its next pass (every 250 ms at
        # most); before that it is "waiting for the scheduler".
        deadline = time.monotonic() + 10
        while True:
            job = self.coord.control.GetJob(control_pb2.GetJobRequest(job_id=resp.job_id),
                                            metadata=self.admin(), timeout=RPC_TIMEOUT)
            if "3" in job.reason or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertEqual(job.id, resp.job_id)
        self.assertEqual(job.state, job_pb2.JOB_STATE_PENDING)
        self.assertIn("3", job.reason, "PENDING reason should say how many workers it needs")
        self.assertEqual(job.spec.name, "py-sft")
        jobs = self.coord.control.ListJobs(control_pb2.ListJobsRequest(), metadata=self.admin(),
                                           timeout=RPC_TIMEOUT)
        self.assertIn(resp.job_id, [j.id for j in jobs.jobs])
        c = self.coord.control.CancelJob(control_pb2.CancelJobRequest(job_id=resp.job_id, reason="py test"),
                                         metadata=self.admin(), timeout=RPC_TIMEOUT)
        self.assertEqual(c.job.state, job_pb2.JOB_STATE_CANCELLED)
        self.assertHealthy()

    def test_list_workers_and_register_twice(self):
        a = self.register("py-twice")
        self.assertEqual(len(a.worker_credential), 64)
        # A second worker with a live worker's name is refused with a clear error.
        e = self.assertCode([grpc.StatusCode.ALREADY_EXISTS], self.register, "py-twice")
        self.assertIn("held by live worker", e.details())
        b = self.register("py-twice", a.worker_credential)
        self.assertTrue(a.worker_id)
        self.assertEqual(a.worker_id, b.worker_id, "re-registering a name keeps its id")
        self.assertGreater(a.lease_ms, 0)
        workers = self.coord.control.ListWorkers(control_pb2.ListWorkersRequest(), metadata=self.admin(),
                                                 timeout=RPC_TIMEOUT)
        named = [w for w in workers.workers if w.name == "py-twice"]
        self.assertEqual(len(named), 1)
        self.assertEqual(named[0].host, "py-host")
        hb = self.coord.cluster_stub.Heartbeat(cluster_pb2.HeartbeatRequest(worker_id=a.worker_id),
                                          metadata=self.worker(a), timeout=RPC_TIMEOUT)
        self.assertFalse(hb.reregister)
        self.assertHealthy()

    # -- auth ------------------------------------------------------------
    def test_auth(self):
        auth = [grpc.StatusCode.UNAUTHENTICATED]
        self.assertCode(auth, self.coord.control.ListWorkers, control_pb2.ListWorkersRequest())
        self.assertCode(auth, self.coord.control.ListWorkers, control_pb2.ListWorkersRequest(),
                        metadata=md("wrong-" + self.coord.admin[:8]))
        self.assertCode(auth, self.coord.control.SubmitJob, control_pb2.SubmitJobRequest(spec=tiny_spec()),
                        metadata=(("authorization", "Basic abc"),))
        # A worker (join) token cannot call Control.
        self.assertCode(auth + [grpc.StatusCode.PERMISSION_DENIED], self.coord.control.ListJobs,
                        control_pb2.ListJobsRequest(), metadata=self.join())
        self.assertCode(auth, self.coord.cluster_stub.RegisterWorker,
                        cluster_pb2.RegisterWorkerRequest(name="nope", device=job_pb2.DEVICE_KIND_CPU))

    # -- bad input -------------------------------------------------------
    def test_bad_job_specs(self):
        invalid = grpc.StatusCode.INVALID_ARGUMENT
        cases = []
        s = tiny_spec(); s.train.steps = -5; cases.append(("train.steps", s))
        s = tiny_spec(); s.train.micro_batch = -2; cases.append(("train.micro_batch", s))
        s = tiny_spec(); s.train.lr = -1.0; cases.append(("train.lr", s))
        s = tiny_spec(); s.rl.temperature = 1e300; s.kind = job_pb2.JOB_KIND_GRPO; cases.append(("rl", s))
        s = tiny_spec(); s.cluster.workers = 1000000; cases.append(("cluster.workers", s))
        s = tiny_spec(); s.model.config.hidden_size = 2 ** 30; cases.append(("model", s))
        s = tiny_spec(); s.name = "x" * (1 << 20); cases.append(("name", s))
        s = tiny_spec(); s.task.data = "/no/such/file/" + "d" * 5000; s.task.name = ""; cases.append(("task", s))
        s = job_pb2.JobSpec(); cases.append(("", s))
        for field, spec in cases:
            print("bad spec case:", field or "(empty)", file=sys.stderr)
            err = self.assertCode([invalid, grpc.StatusCode.RESOURCE_EXHAUSTED], self.coord.control.SubmitJob,
                                  control_pb2.SubmitJobRequest(spec=spec), metadata=self.admin())
            if err.code() == invalid and field:
                self.assertIn(field.split(".")[0], err.details(), "error should name the field")

    def test_text_data_with_disaggregated_placement_is_refused(self):
        # Text data runs co-located only: SubmitJob refuses the pair with the field and the reason.
        spec = tiny_spec(name="py-data-disagg", workers=2)
        spec.kind = job_pb2.JOB_KIND_GRPO
        spec.task.Clear()
        spec.model.Clear()
        setattr(spec.model, "from", "/models/tiny")
        spec.data.train, spec.data.prompt_key, spec.data.answer_key = "/data/train.jsonl", "question", "answer"
        spec.reward.type = "gsm8k"
        spec.placement.mode, spec.placement.rollout_workers, spec.placement.train_workers = "disaggregated", 1, 1
        err = self.assertCode([grpc.StatusCode.INVALID_ARGUMENT], self.coord.control.SubmitJob,
                              control_pb2.SubmitJobRequest(spec=spec), metadata=self.admin())
        self.assertIn("data.train: is not supported with placement.mode: disaggregated", err.details())

    def test_bad_requests(self):
        notfound = [grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT]
        self.assertCode(notfound, self.coord.control.GetJob, control_pb2.GetJobRequest(job_id="no-such-job"),
                        metadata=self.admin())
        self.assertCode(notfound, self.coord.control.GetJob, control_pb2.GetJobRequest(job_id="j" * (1 << 20)),
                        metadata=self.admin())
        self.assertCode([grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND],
                        self.coord.control.GetJob, control_pb2.GetJobRequest(job_id=""), metadata=self.admin())
        self.assertCode(notfound, self.coord.control.DrainWorker,
                        control_pb2.DrainWorkerRequest(worker="no-such-worker"), metadata=self.admin())
        # Without its credential a worker call is refused; an unknown worker
        # is told to register again (or refused), never crashes anything.
        self.assertCode([grpc.StatusCode.UNAUTHENTICATED], self.coord.cluster_stub.Heartbeat,
                        cluster_pb2.HeartbeatRequest(worker_id="w-unknown"), metadata=self.join())
        try:
            hb = self.coord.cluster_stub.Heartbeat(cluster_pb2.HeartbeatRequest(worker_id="w-unknown"),
                                              metadata=self.join() + (("x-tandem-worker-credential", "f" * 64),),
                                              timeout=RPC_TIMEOUT)
            self.assertTrue(hb.reregister)
        except grpc.RpcError as e:
            self.assertIn(e.code(), notfound + [grpc.StatusCode.FAILED_PRECONDITION])
        self.assertHealthy()
        # A message over the size limit is refused, not buffered.
        self.assertCode([grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INVALID_ARGUMENT],
                        self.coord.control.GetJob, control_pb2.GetJobRequest(job_id="z" * (80 << 20)),
                        metadata=self.admin())
        self.assertCode([grpc.StatusCode.INVALID_ARGUMENT], self.coord.cluster_stub.RegisterWorker,
                        cluster_pb2.RegisterWorkerRequest(name="n" * 100000, device=job_pb2.DEVICE_KIND_CPU),
                        metadata=self.join())

    def test_streams_dropped_mid_way(self):
        job = self.coord.control.SubmitJob(control_pb2.SubmitJobRequest(spec=tiny_spec(name="py-watch", workers=7)),
                                           metadata=self.admin(), timeout=RPC_TIMEOUT)
        for _ in range(5):
            call = self.coord.control.WatchJob(control_pb2.WatchJobRequest(job_id=job.job_id, from_start=True),
                                               metadata=self.admin())
            first = next(call)  # at least one event (the current state)
            self.assertEqual(first.job_id, job.job_id)
            call.cancel()
        w = self.register("py-attach")
        for _ in range(3):
            call = self.coord.cluster_stub.Attach(cluster_pb2.AttachRequest(worker_id=w.worker_id),
                                                  metadata=self.worker(w))
            # Attach sends nothing until there is a command, so no event says
            # the stream is open: a moment open, then dropped, is the scenario.
            time.sleep(0.2)
            call.cancel()
        # A fresh channel that vanishes while streaming.
        ch = grpc.insecure_channel(self.coord.grpc_addr)
        stub = control_pb2_grpc.ControlStub(ch)
        call = stub.WatchJob(control_pb2.WatchJobRequest(job_id=job.job_id), metadata=self.admin())
        self.assertEqual(next(call).job_id, job.job_id)  # streaming: the snapshot came
        ch.close()
        self.coord.control.CancelJob(control_pb2.CancelJobRequest(job_id=job.job_id), metadata=self.admin(),
                                     timeout=RPC_TIMEOUT)
        self.assertHealthy()


if __name__ == "__main__":
    unittest.main(verbosity=2)
