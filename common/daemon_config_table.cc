// The daemons' tables: every key of tandem.v1.CoordinatorConfig and
// tandem.v1.WorkerDaemonConfig with its default, range, help and
// command-line flag. --help, the defaults and docs/operations.md
// ("Daemon configuration reference") come from here.
#include "common/config_table.h"
#include "common/daemon_config.h"

namespace tandem::common {
namespace {

constexpr size_t kMaxConfigBytes = 1 << 20;
constexpr double kWeekMs = 7 * 24 * 3.6e6;

ConfigTable* MakeCoordinatorTable() {
  auto* t = new ConfigTable;
  t->name = "coordinator";
  t->message = tandem::v1::CoordinatorConfig::descriptor();
  YamlProtoOptions& o = t->options;
  o.max_text_bytes = kMaxConfigBytes;
  o.rules = {
      {.path = "listen",
       .def = "127.0.0.1:7070",
       .max_len = 256,
       .flag = "listen",
       .help = "gRPC address host:port (port 0 = ephemeral); another host needs TLS or insecure"},
      {.path = "insecure",
       .flag = "insecure",
       .help = "allow plaintext gRPC on a non-loopback address (tokens cross the network unencrypted)"},
      {.path = "state_dir",
       .def = "tandem-state",
       .max_len = 4096,
       .flag = "state-dir",
       .help = "directory of coordinator.db (SQLite state)"},
      {.path = "metrics_listen",
       .def = "0.0.0.0:7071",
       .max_len = 256,
       .flag = "metrics-listen",
       .help = "HTTP /metrics /healthz /readyz address host:port; \"\" = off"},
      {.path = "runs_dir",
       .doc_default = "`<state_dir>/runs`",
       .flag = "runs-dir",
       .help = "job run directories (checkpoints, final model)"},
      {.path = "auth.admin_token_file",
       .flag = "admin-token-file",
       .help = "Control service token file (else $TANDEM_ADMIN_TOKEN)"},
      {.path = "auth.join_token_file",
       .flag = "join-token-file",
       .help = "Cluster service (worker join) token file (else $TANDEM_JOIN_TOKEN)"},
      {.path = "auth.allow_unauthenticated", .help = "development only: no tokens at all"},
      {.path = "tls.cert", .flag = "tls-cert", .help = "PEM server certificate"},
      {.path = "tls.key", .flag = "tls-key", .help = "PEM server private key"},
      {.path = "tls.ca", .flag = "tls-ca", .help = "PEM CA for client certificates"},
      {.path = "tls.require_client_cert",
       .flag = "tls-require-client-cert",
       .help = "mutual TLS for every client (needs tls.cert, tls.key and tls.ca)"},
      {.path = "lease_ms",
       .def = "5000",
       .min = 100,
       .max = 3.6e6,
       .flag = "lease-ms",
       .help = "worker lease in ms; a worker silent this long is LOST"},
      {.path = "heartbeat_ms",
       .def = "1000",
       .min = 10,
       .max = 3.6e6,
       .flag = "heartbeat-ms",
       .help = "heartbeat interval told to workers in ms (< lease_ms)"},
      {.path = "phase_timeout_ms",
       .def = "600000",
       .min = 100,
       .max = kWeekMs,
       .flag = "phase-timeout-ms",
       .help = "timeout of one phase on all ranks in ms"},
      {.path = "setup_timeout_ms",
       .def = "600000",
       .min = 100,
       .max = kWeekMs,
       .help = "timeout of PHASE_SETUP (model build, rendezvous) in ms"},
      {.path = "max_message_bytes",
       .def = "16777216",
       .min = 1 << 16,
       .max = 1 << 30,
       .help = "gRPC receive and send limit"},
      {.path = "reattach_grace_ms",
       .def = "30000",
       .min = 0,
       .max = 3.6e6,
       .help = "after a restart: time for known workers to come back"},
      {.path = "shutdown_grace_ms", .def = "5000", .min = 0, .max = 600000, .help = "SIGTERM: bound on the drain"},
      {.path = "grpc_threads",
       .def = "512",
       .min = 4,
       .max = 65536,
       .help = "sync server threads (each Attach/WatchJob stream holds one)"},
      {.path = "log_level",
       .def = "info",
       .one_of = {"trace", "debug", "info", "warn", "error", "off"},
       .flag = "log-level",
       .help = "log level"},
      {.path = "log_file", .flag = "log-file", .help = "also log to this file (\"\" = stderr only)"},
      {.path = "log_max_bytes", .def = "67108864", .min = 4096, .max = 1e12, .help = "log_file rotated at this size"},
      {.path = "log_max_files", .def = "5", .min = 1, .max = 1000, .help = "rotated log files kept"},
      {.path = "replacement_timeout_ms",
       .doc_default = "30000 (0 = built in)",
       .min = 0,
       .max = 86400000,
       .help = "recovery: wait this long for a replacement worker (a job's recovery section overrides it)"},
      {.path = "max_recoveries",
       .doc_default = "20 (0 = built in)",
       .min = 0,
       .max = 10000,
       .help = "recoveries per job, then it fails"},
      {.path = "preempt_checkpoint_budget_ms",
       .doc_default = "10000 (0 = built in)",
       .min = 0,
       .max = 3.6e6,
       .help = "a preempted worker's job takes a checkpoint first when it fits in this budget"},
      {.path = "lost_worker_retention_ms",
       .def = "3600000",
       .min = 0,
       .max = 365 * 24 * 3.6e6,
       .help = "a LOST worker is forgotten this long after its last heartbeat"},
      {.path = "max_finished_jobs",
       .def = "1000",
       .min = 1,
       .max = 10000000,
       .help = "finished jobs kept in the state store (newest first)"},
      {.path = "finished_job_retention_s",
       .def = "2592000",
       .min = 0,
       .max = 100 * 365 * 86400.0,
       .help = "finished jobs older than this are deleted from the state store (run directories stay)"},
  };
  FinishConfigTable(*t);
  return t;
}

ConfigTable* MakeWorkerTable() {
  auto* t = new ConfigTable;
  t->name = "worker";
  t->message = tandem::v1::WorkerDaemonConfig::descriptor();
  YamlProtoOptions& o = t->options;
  o.max_text_bytes = kMaxConfigBytes;
  o.rules = {
      {.path = "coordinator",
       .def = "127.0.0.1:7070",
       .max_len = 256,
       .flag = "coordinator",
       .help = "coordinator host:port (else $TANDEM_COORDINATOR)"},
      {.path = "name",
       .doc_default = "`<hostname>-<pid>`",
       .max_len = 128,
       .flag = "name",
       .help = "stable worker name; keep it across restarts so the worker keeps its id"},
      {.path = "device",
       .def = "cpu",
       .one_of = {"cpu", "cuda", "cpu-guarded"},
       .flag = "device",
       .help = "compute device (cpu-guarded: CPU compute through the device code path, for debugging)"},
      {.path = "device_index",
       .min = 0,
       .max = 1024,
       .flag = "device-index",
       .help = "GPU index for cuda (ignored when CUDA_VISIBLE_DEVICES is set)"},
      {.path = "data_address",
       .def = "127.0.0.1",
       .max_len = 256,
       .flag = "data-address",
       .help = "address peers use for collectives; \"auto\" = the local address that routes to the coordinator"},
      {.path = "node",
       .doc_default = "the host name",
       .max_len = 128,
       .flag = "node",
       .help = "the machine this worker runs on; workers with the same node share the intra-node tier"},
      {.path = "tier_bandwidth",
       .max_len = 256,
       .flag = "tier-bandwidth",
       .help = "link speeds for planning, intra=X,inter=Y with units Gbit, Mbit, GB/s or MB/s (as in "
               "intra=10Gbit,inter=1Gbit); shown by tandemctl workers"},
      {.path = "threads", .min = 0, .max = 1024, .flag = "threads", .help = "compute threads, 0 = all cores"},
      {.path = "speed",
       .doc_default = "none (calibrated at setup)",
       .min = 0,
       .max = 1e6,
       .flag = "speed",
       .help = "relative speed hint (> 0) for jobs with cluster.shard_by_speed (used when every worker of the job "
               "has one; else every worker measures itself at setup); 0 in a config file = none"},
      {.path = "token_file", .flag = "token-file", .help = "join token file (else $TANDEM_JOIN_TOKEN)"},
      {.path = "tls_ca", .flag = "tls-ca", .help = "PEM CA to verify the coordinator (enables TLS)"},
      {.path = "tls_cert", .flag = "tls-cert", .help = "PEM client certificate (mutual TLS)"},
      {.path = "tls_key", .flag = "tls-key", .help = "PEM client key (mutual TLS)"},
      // Below the usual grace of orchestrators (Kubernetes and Slurm's
      // KillWait: 30 s) so the worker leaves on its own before a SIGKILL.
      {.path = "preempt_timeout_ms",
       .def = "25000",
       .min = 0,
       .max = 3.6e6,
       .flag = "preempt-timeout-ms",
       .help = "SIGTERM in a job: wait this long for the coordinator to checkpoint and release the worker; "
               "a second SIGTERM or SIGINT stops at once; 0 = stop at once"},
      {.path = "log_level",
       .def = "info",
       .one_of = {"trace", "debug", "info", "warn", "error", "off"},
       .flag = "log-level",
       .help = "log level"},
      {.path = "log_file", .flag = "log-file", .help = "also log to this file (\"\" = stderr only)"},
      {.path = "log_max_bytes", .def = "67108864", .min = 4096, .max = 1e12, .help = "log_file rotated at this size"},
      {.path = "log_max_files", .def = "5", .min = 1, .max = 1000, .help = "rotated log files kept"},
  };
  FinishConfigTable(*t);
  return t;
}

}  // namespace

const ConfigTable& CoordinatorConfigTable() {
  static const ConfigTable* table = MakeCoordinatorTable();
  return *table;
}

const ConfigTable& WorkerConfigTable() {
  static const ConfigTable* table = MakeWorkerTable();
  return *table;
}

}  // namespace tandem::common
