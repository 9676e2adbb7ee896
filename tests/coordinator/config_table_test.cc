// The config tables (common/config_table.h): every row of every table gets
// bad input (below its minimum, above its maximum, a wrong type, a value not
// allowed, too long) and must be refused with a message naming its path;
// the defaults applied are the documented ones; docs/ shows the tables as
// they are.
#include "common/config_table.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include <google/protobuf/text_format.h>
#include <yaml-cpp/yaml.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/config_doc.h"
#include "common/daemon_config.h"
#include "common/job_spec.h"
#include "server/recovery/policy.h"

namespace tandem::common {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// Valid with every key at its default: bad values of one key are its error.
const char kMinimalJob[] = R"(
kind: grpo
model: {config: {vocab_size: 128, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1,
                 num_attention_heads: 4}}
)";

struct Row {
  std::string table;
  size_t index;
};

const ConfigTable& TableOf(const Row& row) { return *FindConfigTable(row.table); }
const ConfigKey& KeyOf(const Row& row) { return TableOf(row).keys()[row.index]; }

// Loads the table's document with one key set ("path=value" as --set).
absl::Status LoadWith(const Row& row, const std::string& assignment) {
  if (row.table == "job") return ParseJobSpecYaml(kMinimalJob, {assignment}).status();
  if (row.table == "coordinator") return LoadCoordinatorConfig("", {assignment}).status();
  return LoadWorkerConfig("", {assignment}).status();
}

std::string Shown(const Row& row) { return DisplayPath(TableOf(row).options, std::string(KeyOf(row).path)); }

const FieldDescriptor* FieldOf(const Row& row) { return FindFieldByPath(TableOf(row).message, KeyOf(row).path); }

bool IsInteger(const FieldDescriptor* f) {
  return f->cpp_type() != FieldDescriptor::CPPTYPE_DOUBLE && f->cpp_type() != FieldDescriptor::CPPTYPE_FLOAT;
}

std::string Number(const FieldDescriptor* f, double v) {
  return IsInteger(f) ? absl::StrCat(static_cast<int64_t>(v)) : absl::StrFormat("%.17g", v);
}

// A bound as error messages write it.
std::string Bound(double v) {
  if (std::abs(v) < 1e15 && v == std::floor(v)) return absl::StrCat(static_cast<int64_t>(v));
  return absl::StrCat(v);
}

// "path=value", a list of one element for repeated keys.
std::string Set(const Row& row, const std::string& value) {
  return absl::StrCat(Shown(row), "=", FieldOf(row)->is_repeated() ? absl::StrCat("[", value, "]") : value);
}

void ExpectRefused(const Row& row, const std::string& assignment, absl::string_view expect) {
  const absl::Status st = LoadWith(row, assignment);
  ASSERT_FALSE(st.ok()) << assignment;
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  // Daemon configs say where the config came from first ("config: ").
  std::string message(st.message());
  if (absl::StartsWith(message, "config: ")) message = message.substr(8);
  EXPECT_TRUE(absl::StartsWith(message, Shown(row))) << assignment << " -> " << message;
  EXPECT_TRUE(absl::StrContains(message, expect))
      << assignment << " -> " << message << " (expected '" << expect << "')";
}

class ConfigRowTest : public ::testing::TestWithParam<Row> {};

TEST_P(ConfigRowTest, BelowMinimumNamesPathAndBound) {
  const ConfigKey& key = KeyOf(GetParam());
  const FieldDescriptor* f = FieldOf(GetParam());
  // No minimum: nothing to check for this row.
  if (key.min <= -1e300 || f->cpp_type() == FieldDescriptor::CPPTYPE_ENUM) return;
  const double below = key.min_exclusive ? key.min : key.min - 1;
  ExpectRefused(GetParam(), Set(GetParam(), Number(f, below)),
                absl::StrCat(key.min_exclusive ? "must be > " : "must be >= ", Bound(key.min)));
}

TEST_P(ConfigRowTest, AboveMaximumNamesPathAndBound) {
  const ConfigKey& key = KeyOf(GetParam());
  const FieldDescriptor* f = FieldOf(GetParam());
  if (key.max >= 1e300) return;  // no maximum: nothing to check for this row
  const double above = IsInteger(f) ? key.max + 1 : key.max + std::max(1.0, std::abs(key.max));
  ExpectRefused(GetParam(), Set(GetParam(), Number(f, above)), absl::StrCat("must be <= ", Bound(key.max)));
}

TEST_P(ConfigRowTest, WrongTypeNamesPath) {
  const FieldDescriptor* f = FieldOf(GetParam());
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      ExpectRefused(GetParam(), absl::StrCat(Shown(GetParam()), "={a: 1}"), "expected");
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      ExpectRefused(GetParam(), Set(GetParam(), "maybe"), "expected true or false");
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      ExpectRefused(GetParam(), Set(GetParam(), "bogus"), "is not allowed; allowed:");
      break;
    default:
      ExpectRefused(GetParam(), Set(GetParam(), "abc"), "expected");
      break;
  }
  if (f->is_repeated()) ExpectRefused(GetParam(), absl::StrCat(Shown(GetParam()), "=abc"), "expected a list");
}

TEST_P(ConfigRowTest, DisallowedValueNamesPathAndAllowed) {
  const ConfigKey& key = KeyOf(GetParam());
  if (key.one_of.empty()) return;  // any value: nothing to check for this row
  ExpectRefused(GetParam(), Set(GetParam(), "not-a-value"), "is not allowed; allowed: ");
}

TEST_P(ConfigRowTest, TooLongNamesPath) {
  const ConfigKey& key = KeyOf(GetParam());
  const FieldDescriptor* f = FieldOf(GetParam());
  if (f->is_repeated()) {
    std::vector<std::string> many(key.max_len + 1, f->cpp_type() == FieldDescriptor::CPPTYPE_STRING ? "x" : "1");
    ExpectRefused(GetParam(), absl::StrCat(Shown(GetParam()), "=[", absl::StrJoin(many, ", "), "]"),
                  "too many elements");
  } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING && key.one_of.empty()) {
    ExpectRefused(GetParam(), Set(GetParam(), std::string(key.max_len + 1, 'x')), "too long");
  } else {
    return;  // no length: nothing to check for this row
  }
}

// The value of `path` in `msg` as text ("" when a message on the way is unset).
std::string ValueText(const Message& msg, absl::string_view path) {
  const Message* m = &msg;
  std::vector<std::string> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const FieldDescriptor* f = m->GetDescriptor()->FindFieldByName(parts[i]);
    if (!m->GetReflection()->HasField(*m, f)) return "";
    m = &m->GetReflection()->GetMessage(*m, f);
  }
  std::string out;
  google::protobuf::TextFormat::PrintFieldValueToString(*m, m->GetDescriptor()->FindFieldByName(parts.back()), -1,
                                                        &out);
  return out;
}

// The default a file gets is the row's, and an API message with the key
// left at zero gets it too (unless zero is a value there).
TEST_P(ConfigRowTest, DefaultsAreTheTablesDefaults) {
  const ConfigTable& table = TableOf(GetParam());
  const ConfigKey& key = KeyOf(GetParam());
  if (key.def.empty()) return;  // no literal default: nothing to check for this row
  ASSERT_TRUE(LoadWith(GetParam(), absl::StrCat(Shown(GetParam()), "=", key.def)).ok());
  // An empty message of the table's type with only this key read.
  auto parsed = [&]() -> std::string {
    YamlProtoOptions options = table.options;
    std::unique_ptr<Message> m(table.defaults->New());
    auto root = ParseYaml("{}", "test");
    EXPECT_TRUE(root.ok());
    EXPECT_TRUE(ApplyYamlOverride(*root, absl::StrCat(Shown(GetParam()), "=", key.def)).ok());
    EXPECT_TRUE(YamlToProto(*root, m.get(), options).ok());
    return ValueText(*m, key.path);
  }();
  std::unique_ptr<Message> api(table.defaults->New());
  if (GetParam().table == "job") {
    // model.config defaults apply when there is an inline config.
    static_cast<tandem::v1::JobSpec*>(api.get())->mutable_model()->mutable_config();
  }
  ApplyDefaults(table, api.get());
  if (!key.zero_is_value) {
    EXPECT_EQ(ValueText(*api, key.path), parsed) << key.path;
  }
  std::unique_ptr<Message> file(table.defaults->New());
  SetDefaults(table, file.get());
  if (!absl::StartsWith(key.path, "model.")) {
    EXPECT_EQ(ValueText(*file, key.path), parsed) << key.path;
  }
}

std::vector<Row> AllRows() {
  std::vector<Row> rows;
  for (const ConfigTable* t : AllConfigTables()) {
    for (size_t i = 0; i < t->keys().size(); ++i) rows.push_back({t->name, i});
  }
  return rows;
}

INSTANTIATE_TEST_SUITE_P(EveryKey, ConfigRowTest, ::testing::ValuesIn(AllRows()),
                         [](const ::testing::TestParamInfo<Row>& info) {
                           std::string name = absl::StrCat(info.param.table, "_", KeyOf(info.param).path);
                           for (char& c : name) {
                             if (c == '.') c = '_';
                           }
                           return name;
                         });

// Every leaf field of the message has a row: a new field without one (and
// so without a default, range, help and docs) fails here.
void CollectLeaves(const google::protobuf::Descriptor* d, const std::string& path, std::vector<std::string>* out) {
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const std::string fp = path.empty() ? f->name() : absl::StrCat(path, ".", f->name());
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated()) {
      CollectLeaves(f->message_type(), fp, out);
    } else {
      out->push_back(fp);
    }
  }
}

TEST(ConfigTableTest, EveryFieldHasARowAndTablesAreConsistent) {
  for (const ConfigTable* t : AllConfigTables()) {
    EXPECT_TRUE(CheckConfigTable(*t).ok()) << CheckConfigTable(*t);
    std::vector<std::string> leaves;
    CollectLeaves(t->message, "", &leaves);
    for (const std::string& leaf : leaves) EXPECT_NE(t->options.FindRule(leaf), nullptr) << t->name << ": " << leaf;
  }
}

TEST(ConfigTableTest, KnownDefaults) {
  const tandem::v1::JobSpec job = DefaultJobSpec();
  EXPECT_EQ(job.train().micro_batch(), 4);
  EXPECT_DOUBLE_EQ(job.train().lr(), 1e-3);
  EXPECT_EQ(job.train().precision(), "fp32");
  EXPECT_TRUE(job.rl().scale_rewards());
  EXPECT_EQ(job.cluster().device(), tandem::v1::DEVICE_KIND_CPU);
  EXPECT_FALSE(job.has_model());
  EXPECT_TRUE(job.has_init());
  const tandem::v1::CoordinatorConfig c = DefaultCoordinatorConfig();
  EXPECT_EQ(c.lease_ms(), 5000);
  EXPECT_EQ(c.max_message_bytes(), 16 << 20);
  EXPECT_EQ(c.finished_job_retention_s(), 30 * 86400);
  EXPECT_TRUE(c.has_tls());
  const tandem::v1::WorkerDaemonConfig w = DefaultWorkerConfig();
  EXPECT_EQ(w.preempt_timeout_ms(), 25000);
  EXPECT_EQ(w.device(), "cpu");
}

// The recovery knobs' zero takes the coordinator's built-in policy; the
// documented numbers are that policy's.
TEST(ConfigTableTest, RecoveryDefaultsShownAreThePolicys) {
  const ConfigTable& t = CoordinatorConfigTable();
  EXPECT_TRUE(absl::StartsWith(DefaultText(t, *t.options.FindRule("replacement_timeout_ms")),
                               absl::StrCat(server::kDefaultReplacementTimeoutMs, " ")));
  EXPECT_TRUE(absl::StartsWith(DefaultText(t, *t.options.FindRule("max_recoveries")),
                               absl::StrCat(server::kDefaultMaxRecoveries, " ")));
  EXPECT_TRUE(absl::StartsWith(DefaultText(t, *t.options.FindRule("preempt_checkpoint_budget_ms")),
                               absl::StrCat(server::kDefaultPreemptCheckpointBudgetMs, " ")));
}

// Specs from older clients (missing keys) get every default, derived ones
// included; applying them twice changes nothing.
TEST(ConfigTableTest, ApiDefaultsAreIdempotentAndDerived) {
  tandem::v1::JobSpec spec;
  spec.set_kind(tandem::v1::JOB_KIND_GRPO);
  auto* m = spec.mutable_model()->mutable_config();
  m->set_num_attention_heads(4);
  spec.mutable_rl()->set_clip(0.3);
  spec.mutable_train()->set_lr(0.02);
  spec.mutable_cluster()->set_workers(2);
  ApplyJobDefaults(&spec);
  EXPECT_EQ(m->num_key_value_heads(), 4);
  EXPECT_DOUBLE_EQ(m->rms_norm_eps(), 1e-5);
  EXPECT_DOUBLE_EQ(spec.rl().clip_high(), 0.3);
  EXPECT_DOUBLE_EQ(spec.init().sft_lr(), 0.02);
  EXPECT_EQ(spec.cluster().min_workers(), 2);
  EXPECT_DOUBLE_EQ(spec.rl().temperature(), 1.0);
  EXPECT_EQ(spec.task().name(), "arithmetic");
  EXPECT_EQ(spec.name(), "grpo-job");
  tandem::v1::JobSpec again = spec;
  ApplyJobDefaults(&again);
  EXPECT_EQ(again.SerializeAsString(), spec.SerializeAsString());
  // A spec from an older client without the model section gets none.
  tandem::v1::JobSpec from_dir;
  from_dir.mutable_model()->set_from("/m");
  ApplyJobDefaults(&from_dir);
  EXPECT_FALSE(from_dir.model().has_config());
}

std::string ReadSource(const std::string& rel) {
  std::ifstream in(std::string(TANDEM_SOURCE_DIR) + "/" + rel);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// docs/ shows every key of every table, as the tables say.
TEST(ConfigTableTest, DocsMatchTheTables) {
  std::set<std::string> covered;
  for (const char* doc : {"docs/job-spec.md", "docs/operations.md"}) {
    const std::string text = ReadSource(doc);
    ASSERT_FALSE(text.empty()) << doc;
    auto rendered = RenderConfigDoc(text, &covered);
    ASSERT_TRUE(rendered.ok()) << doc << ": " << rendered.status();
    EXPECT_TRUE(*rendered == text) << doc << " differs from the config tables: run "
                                   << "build/bin/tandem-config-doc docs/job-spec.md docs/operations.md";
  }
  for (const ConfigTable* t : AllConfigTables()) {
    for (const ConfigKey& key : t->keys()) {
      EXPECT_TRUE(covered.count(absl::StrCat(t->name, ":", key.path))) << t->name << ":" << key.path << " not in docs/";
    }
  }
}

TEST(ConfigTableTest, RenderConfigDocErrors) {
  EXPECT_FALSE(RenderConfigDoc("<!-- config-table nope * -->\n<!-- end config-table -->").ok());
  EXPECT_FALSE(RenderConfigDoc("<!-- config-table job nosuch -->\n<!-- end config-table -->").ok());
  EXPECT_FALSE(RenderConfigDoc("<!-- config-table job train -->\n").ok());
  auto ok = RenderConfigDoc("a\n<!-- config-table job checkpoint -->\nold\n<!-- end config-table -->\nb\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(absl::StrContains(*ok, "| `keep` | int | 3 | 1..1000 | newest kept |")) << *ok;
  EXPECT_TRUE(absl::EndsWith(*ok, "<!-- end config-table -->\nb\n")) << *ok;
}

// --help comes from the table: every flag with its range and default.
TEST(ConfigTableTest, HelpComesFromTheTable) {
  const std::string usage = DaemonUsage("tandem-coordinator", "summary", CoordinatorFlags());
  EXPECT_TRUE(absl::StrContains(usage, "--lease-ms VALUE")) << usage;
  EXPECT_TRUE(absl::StrContains(usage, "worker lease in ms; a worker silent this long is LOST (100..3600000) [5000]"))
      << usage;
  EXPECT_TRUE(absl::StrContains(usage, "--insecure ")) << usage;
  const std::string worker = DaemonUsage("tandem-worker", "summary", WorkerFlags());
  EXPECT_TRUE(absl::StrContains(worker, "(cpu, cuda, cpu-guarded) [cpu]")) << worker;
  for (const ConfigTable* t : {&CoordinatorConfigTable(), &WorkerConfigTable()}) {
    const auto& flags = t == &CoordinatorConfigTable() ? CoordinatorFlags() : WorkerFlags();
    size_t with_flag = 0;
    for (const ConfigKey& key : t->keys()) with_flag += !key.flag.empty();
    EXPECT_EQ(flags.size(), with_flag);
  }
}

}  // namespace
}  // namespace tandem::common
