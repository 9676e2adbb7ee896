// Writes the generated part of the seed corpus (files named gen-*) into
// CORPUS/<target>/, with the product's own writers: model.safetensors files
// of the tiny fixture model, its config.json, checkpoint shards and
// manifests naming the fixture shards, and RPC call sequences. The other
// seeds (real configs, hand-made near-valid files, regression inputs)
// are kept in the repository as they are. Deterministic: rerunning it
// rewrites the same bytes.
//   build/bin/fuzz_make_seeds tests/fuzz/corpus
#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/checkpoint_path.h"
#include "common/job_spec.h"
#include "nlohmann/json.hpp"
#include "tandem/v1/cluster.pb.h"
#include "tandem/v1/control.pb.h"
#include "tests/fuzz/fixtures.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/model/config.h"
#include "worker/model/param_layout.h"
#include "worker/model/safetensors.h"

namespace tandem::fuzz {
namespace {

namespace fs = std::filesystem;
namespace v1 = tandem::v1;

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void Write(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
  std::printf("%s (%zu bytes)\n", p.c_str(), bytes.size());
}

void Check(const absl::Status& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "make_seeds: %s: %s\n", what, st.ToString().c_str());
    std::exit(1);
  }
}

// A safetensors file from a header (JSON) and the data section.
std::string Safetensors(const nlohmann::json& header, const std::string& data) {
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  return out + h + data;
}

void SafetensorsSeeds(const fs::path& out, const fs::path& tmp) {
  const model::ModelConfig config = TinyModelConfig();
  std::vector<float> params(model::ParamLayout(config).total_floats());
  for (size_t i = 0; i < params.size(); ++i) params[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
  for (auto [dtype, name] :
       {std::pair{model::StDtype::kF32, "gen-tiny-f32"}, std::pair{model::StDtype::kBF16, "gen-tiny-bf16"}}) {
    const fs::path dir = tmp / name;
    model::SaveOptions save;
    save.dtype = dtype;
    Check(model::SaveModelDir(dir.string(), config, params.data(), nullptr, save), "SaveModelDir");
    Write(out / "safetensors" / name, ReadAll(dir / "model.safetensors"));
  }
  // F16 and F64 tensors, metadata and an empty tensor: the other readers.
  nlohmann::json h;
  h["__metadata__"] = {{"format", "pt"}};
  h["half"] = {{"dtype", "F16"}, {"shape", {2, 2}}, {"data_offsets", {0, 8}}};
  h["double"] = {{"dtype", "F64"}, {"shape", {2}}, {"data_offsets", {8, 24}}};
  h["empty"] = {{"dtype", "F32"}, {"shape", {0, 3}}, {"data_offsets", {24, 24}}};
  std::string data;
  for (uint16_t v : {0x3c00, 0xbc00, 0x0001, 0x7c00}) data.append(reinterpret_cast<const char*>(&v), 2);
  for (double v : {1.5, -2.25}) data.append(reinterpret_cast<const char*>(&v), 8);
  Write(out / "safetensors" / "gen-dtypes", Safetensors(h, data));
  Write(out / "safetensors" / "gen-empty-header", Safetensors(nlohmann::json::object(), ""));
}

void ConfigSeeds(const fs::path& out) {
  model::ModelConfig c = TinyModelConfig();
  Write(out / "model_config" / "gen-tiny-qwen2.json", model::ToConfigJson(c));
  c.model_type = "llama";
  c.tie_word_embeddings = true;
  c.has_rope_scaling = true;
  c.rope_scaling.rope_type = "yarn";
  c.rope_scaling.factor = 4;
  c.rope_scaling.original_max_position_embeddings = 8;
  c.eos_token_ids = {2, 3};
  c.bos_token_id = 1;
  c.sliding_window = 4;
  c.sliding_window_set = true;
  c.layer_types = {"sliding_attention"};
  Write(out / "model_config" / "gen-tiny-llama-yarn.json", model::ToConfigJson(c));
}

void CheckpointSeeds(const fs::path& out, const fs::path& tmp) {
  const fs::path dir = tmp / "ckpt";
  fs::create_directories(dir);
  auto infos = WriteFixtureShards(dir.string());
  if (infos.empty()) Check(absl::InternalError("cannot write the fixture shards"), "WriteFixtureShards");
  int n = 0;
  for (const auto& [world, info] : infos) {
    Write(out / "ckpt_shard" / ("gen-" + info.file), ReadAll(dir / info.file));
    (void)world;
    ++n;
  }
  // Manifests: world size 2 and world size 1, each as written (version 2,
  // with its checksum) and as version 1 (no checksum: edits reach every check).
  for (int world : {2, 1}) {
    ckpt::Manifest m;
    m.step = 20;
    m.world_size = world;
    m.zero_stage = world == 2 ? 2 : 0;
    m.generation = 1;
    m.policy_version = 3;
    m.optimizer_steps = 20;
    m.total_floats = kFixtureTotalFloats;
    m.config_hash = "0123456789abcdef";
    m.rng_state = "seed=1;counter=40";
    m.data_cursor = "epoch=0;pos=160";
    m.extra = {{"loss", 0.5}};
    for (const auto& [w, info] : infos) {
      if (w == world) m.shards.push_back(info);
    }
    Check(ckpt::WriteManifest(dir.string(), m), "WriteManifest");
    const std::string text = ReadAll(dir / "manifest.json");
    const std::string name = "gen-world" + std::to_string(world);
    Write(out / "ckpt_manifest" / (name + "-v2.json"), text);
    auto j = nlohmann::json::parse(text);
    j.erase("checksum");
    j["version"] = 1;
    Write(out / "ckpt_manifest" / (name + "-v1.json"), j.dump(2));
  }
}

// One call of the RPC target's input format.
void AddCall(std::string* input, int rpc, int caller, const google::protobuf::Message& request) {
  const std::string bytes = request.SerializeAsString();
  input->push_back(static_cast<char>(rpc | (caller << 4)));
  input->push_back(static_cast<char>(bytes.size() & 0xff));
  input->push_back(static_cast<char>(bytes.size() >> 8));
  *input += bytes;
}

void RpcSeeds(const fs::path& out) {
  const fs::path d = out / "rpc";
  auto spec = common::ParseJobSpecYaml(kFixtureJobYaml);
  Check(spec.status(), "ParseJobSpecYaml");
  std::string in;
  {
    v1::SubmitJobRequest submit;
    *submit.mutable_spec() = *spec;
    v1::GetJobRequest get;
    get.set_job_id("j-000004");
    v1::CancelJobRequest cancel;
    cancel.set_job_id("j-000004");
    cancel.set_reason("seed");
    AddCall(&in, 0, 4, submit);
    AddCall(&in, 1, 4, get);
    AddCall(&in, 3, 4, cancel);
    Write(d / "gen-submit-get-cancel", in);
  }
  {
    in.clear();
    v1::ListJobsRequest list;
    list.set_state(v1::JOB_STATE_RUNNING);
    list.set_limit(10);
    v1::ListWorkersRequest workers;
    v1::DrainWorkerRequest drain;
    drain.set_worker("w-2");
    v1::GetJobLogsRequest logs;
    logs.set_job_id("j-000001");
    logs.set_limit(5);
    v1::ListCheckpointsRequest checkpoints;
    checkpoints.set_job_id("j-000001");
    AddCall(&in, 2, 0, list);
    AddCall(&in, 4, 0, workers);
    AddCall(&in, 5, 0, drain);
    AddCall(&in, 6, 0, logs);
    AddCall(&in, 7, 0, checkpoints);
    Write(d / "gen-control-reads", in);
  }
  {
    in.clear();
    v1::RegisterWorkerRequest reg;
    reg.set_name("seed-worker");
    reg.set_host("127.0.0.1");
    reg.set_device(v1::DEVICE_KIND_CPU);
    reg.set_device_count(1);
    reg.set_memory_bytes(1 << 30);
    reg.set_version("0.1.0");
    reg.set_data_address("127.0.0.1");
    v1::HeartbeatRequest beat;
    beat.set_worker_id("w-4");
    beat.set_memory_bytes_in_use(1 << 20);
    beat.set_preempting(true);
    AddCall(&in, 8, 2, reg);
    AddCall(&in, 9, 2, beat);
    Write(d / "gen-register-heartbeat", in);
  }
  {
    in.clear();
    v1::ReportPhaseRequest report;
    report.set_worker_id("w-1");
    report.set_command_id("j-000001/g1/u2/p0");
    report.set_job_id("j-000001");
    report.set_generation(1);
    report.set_phase(v1::PHASE_SFT_STEP);
    report.set_step(2);
    report.set_ok(true);
    report.set_seconds(0.5);
    (*report.mutable_values())["loss"] = 1.25;
    report.add_log_lines("step 2 loss 1.25");
    auto* published = report.add_checkpoints();
    published->set_step(2);
    published->set_path(common::CheckpointStepPath(std::string(kFixtureRunsDir) + "/j-000001/checkpoints", 2));
    published->set_bytes(4096);
    AddCall(&in, 10, 1, report);
    report.set_ok(false);
    report.set_error("collective timed out");
    report.set_retryable(true);
    report.mutable_failure()->set_kind(v1::PHASE_FAILURE_KIND_RETRYABLE);
    report.mutable_failure()->set_code(4);  // DEADLINE_EXCEEDED
    report.mutable_failure()->set_message("collective timed out");
    report.clear_checkpoints();
    AddCall(&in, 10, 1, report);
    report.set_phase(v1::PHASE_SETUP);
    report.mutable_failure()->set_kind(v1::PHASE_FAILURE_KIND_RESTORE_FAILED);
    report.mutable_setup()->set_checkpoints_skipped(1);
    AddCall(&in, 10, 1, report);
    Write(d / "gen-report-phase", in);
  }
  {
    in.clear();
    v1::StoreScope scope;
    scope.set_job_id("j-000001");
    scope.set_generation(1);
    v1::StoreSetRequest set;
    *set.mutable_scope() = scope;
    set.set_key("rank0/addr");
    set.set_value("127.0.0.1:29500");
    v1::StoreGetRequest get;
    *get.mutable_scope() = scope;
    get.set_key("rank0/addr");
    get.set_timeout_ms(10);
    v1::StoreAddRequest add;
    *add.mutable_scope() = scope;
    add.set_key("barrier");
    add.set_delta(1);
    v1::StoreWaitRequest wait;
    *wait.mutable_scope() = scope;
    wait.add_keys("rank0/addr");
    wait.add_keys("barrier");
    wait.set_timeout_ms(10);
    v1::StoreDeleteRequest del;
    *del.mutable_scope() = scope;
    del.set_key("barrier");
    AddCall(&in, 11, 1, set);
    AddCall(&in, 12, 1, get);
    AddCall(&in, 13, 1, add);
    AddCall(&in, 14, 1, wait);
    AddCall(&in, 15, 1, del);
    Write(d / "gen-store", in);
  }
}

}  // namespace
}  // namespace tandem::fuzz

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR  (e.g. tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  std::string tmp_template = (fs::temp_directory_path() / "tandem-make-seeds-XXXXXX").string();
  if (::mkdtemp(tmp_template.data()) == nullptr) return 1;
  const fs::path tmp = tmp_template;
  tandem::fuzz::SafetensorsSeeds(out, tmp);
  tandem::fuzz::ConfigSeeds(out);
  tandem::fuzz::CheckpointSeeds(out, tmp);
  tandem::fuzz::RpcSeeds(out);
  fs::remove_all(tmp);
  return 0;
}
