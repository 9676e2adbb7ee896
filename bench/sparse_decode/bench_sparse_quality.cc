// bench_sparse_quality: what top-k block-sparse attention (rollout.sparse)
// changes in a trained model's next-token distributions over a long
// sequence, and what it saves per decode step.
//
//   bench_sparse_quality --model DIR [--document rows|text] [--task reverse]
//       [--min-len 8] [--max-len 24] [--context 8192] [--top-k-blocks 8]
//       [--block-size 64] [--sink-blocks 1] [--recent-blocks 2]
//       [--page 16] [--chunk 256] [--decode-steps 16] [--threads 2]
//       [--seed 1]
//
// DIR is a char-tokenizer model directory (`tandemctl run --local` leaves
// one in RUN/final/). The sequence is a document of --context tokens of
// task examples (held-out instances of the built-in task), one after the
// other: as text after one bos, "rev:abc=cba;rev:...", with --document text
// (the default: make_docs.py's format, which run.sh trains the model on),
// or as SFT rows (bos, prompt, answer, eos) with --document rows. Two paged
// decoders run
// it, one dense and one sparse, in prefill chunks of --chunk rows with the
// logits of every row (a chunk's rows attend exactly as one-token decode
// steps would). Reported over the positions past the sparse attention's
// dense span ((sink + recent + top-k) blocks; before it the two are equal):
// top-1 agreement, mean and max KL(dense || sparse) of the next-token
// distribution, over all positions and over those whose next token is an
// answer character or the eos / ';' after it (the positions a trained model
// is sure of; elsewhere the next character is random and near-ties flip the
// argmax), and the exact-match rate of answer tokens under each. Last,
// --decode-steps one-token decode steps at the end of the document:
// milliseconds per step, dense and sparse. The model's position limit is
// raised to the document.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backends.h"
#include "worker/model/param_layout.h"
#include "worker/model/safetensors.h"
#include "worker/rl/tasks.h"
#include "worker/rollout/kv_pool.h"
#include "worker/rollout/paged_decoder.h"

namespace {

using namespace tandem;

const char kUsage[] =
    "usage: bench_sparse_quality --model DIR [--document rows|text] [--task reverse] [--min-len 8] [--max-len 24]\n"
    "         [--context 8192]\n"
    "         [--top-k-blocks 8] [--block-size 64] [--sink-blocks 1] [--recent-blocks 2] [--page 16]\n"
    "         [--chunk 256] [--decode-steps 16] [--threads 2] [--seed 1]\n";

struct Flags {
  std::string model, task = "reverse", document = "text";
  std::map<std::string, int> n = {{"--min-len", 8},       {"--max-len", 24},    {"--context", 8192},
                                  {"--top-k-blocks", 8},  {"--block-size", 64}, {"--sink-blocks", 1},
                                  {"--recent-blocks", 2}, {"--page", 16},       {"--chunk", 256},
                                  {"--decode-steps", 16}, {"--threads", 2},     {"--seed", 1}};
};

Flags Parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n%s", k.c_str(), kUsage);
      std::exit(2);
    }
    const std::string v = argv[++i];
    if (k == "--model") {
      f.model = v;
    } else if (k == "--task") {
      f.task = v;
    } else if (k == "--document" && (v == "rows" || v == "text")) {
      f.document = v;
    } else if (f.n.count(k)) {
      char* end = nullptr;
      const long x = std::strtol(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || x < 0 || x > (1 << 22)) {
        std::fprintf(stderr, "%s: '%s' is not an integer in [0, 4194304]\n", k.c_str(), v.c_str());
        std::exit(2);
      }
      f.n[k] = static_cast<int>(x);
    } else {
      std::fprintf(stderr, "unknown flag %s\n%s", k.c_str(), kUsage);
      std::exit(2);
    }
  }
  if (f.model.empty()) {
    std::fprintf(stderr, "--model is required\n%s", kUsage);
    std::exit(2);
  }
  return f;
}

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// One sequence through a PagedDecoder over its own KV pool (pages in order).
class Runner {
 public:
  Runner(const model::ModelConfig& c, kernels::Ops* ops, model::ParamProvider& pp, int page, int positions, int chunk,
         const kernels::SparseDecodeParams* sparse)
      : dec_(c, ops, nullptr), pp_(pp), page_(page), sparse_(sparse) {
    const int pages = (positions + page - 1) / page;
    if (!kv_.Allocate(dec_.memory(), dec_.num_layers(), dec_.kv_dim(), page, pages, kernels::KvDtype::kF32,
                      sparse != nullptr)
             .ok() ||
        !dec_.Reserve(chunk, chunk, positions).ok()) {
      std::fprintf(stderr, "cannot allocate the KV cache of %d positions\n", positions);
      std::exit(1);
    }
    for (int i = 0; i < pages; ++i) table_.push_back(i);
  }
  // Rows [start, start + ids.size()); returns the logits of every row.
  const float* Run(const std::vector<int32_t>& ids, int start) {
    const int n = static_cast<int>(ids.size());
    pos_.resize(n);
    seq_.assign(n, 0);
    slot_.resize(n);
    out_.resize(n);
    for (int i = 0; i < n; ++i) {
      pos_[i] = start + i;
      slot_[i] = table_[(start + i) / page_] * page_ + (start + i) % page_;
      out_[i] = i;
    }
    rollout::ForwardBatch b;
    b.rows = n;
    b.tokens = ids.data();
    b.positions = pos_.data();
    b.row_seq = seq_.data();
    b.slots = slot_.data();
    b.block_tables = table_.data();
    b.max_blocks = static_cast<int>(table_.size());
    b.num_out = n;
    b.out_rows = out_.data();
    b.sparse = sparse_;
    if (auto st = dec_.Forward(pp_, kv_, b); !st.ok()) {
      std::fprintf(stderr, "forward: %s\n", std::string(st.message()).c_str());
      std::exit(1);
    }
    return dec_.logits();
  }

 private:
  rollout::PagedDecoder dec_;
  model::ParamProvider& pp_;
  rollout::KvPool kv_;
  int page_;
  const kernels::SparseDecodeParams* sparse_;
  std::vector<int32_t> table_, pos_, seq_, slot_, out_;
};

void LogSoftmax(const float* x, int v, std::vector<double>* out) {
  out->resize(v);
  const double mx = *std::max_element(x, x + v);
  double z = 0;
  for (int i = 0; i < v; ++i) z += std::exp(x[i] - mx);
  const double lz = mx + std::log(z);
  for (int i = 0; i < v; ++i) (*out)[i] = x[i] - lz;
}

int Argmax(const float* x, int v) { return static_cast<int>(std::max_element(x, x + v) - x); }

}  // namespace

int main(int argc, char** argv) {
  const Flags f = Parse(argc, argv);
  auto N = [&](const char* k) { return f.n.at(k); };
  auto loaded = model::LoadModelDir(f.model);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s: %s\n", f.model.c_str(), std::string(loaded.status().message()).c_str());
    return 1;
  }
  if (!loaded->tokenizer) {
    std::fprintf(stderr, "%s: needs the char tokenizer (tokenizer: char)\n", f.model.c_str());
    return 1;
  }
  rl::TaskOptions to;
  to.name = f.task;
  to.min_len = N("--min-len");
  to.max_len = N("--max-len");
  auto task = rl::MakeTask(to);
  if (!task.ok()) {
    std::fprintf(stderr, "--task: %s\n", std::string(task.status().message()).c_str());
    return 2;
  }
  const kernels::SparseDecodeParams sp{N("--block-size"), N("--top-k-blocks"), N("--sink-blocks"),
                                       N("--recent-blocks")};
  const int page = N("--page"), chunk = std::max(1, N("--chunk")), context = N("--context");
  if (page < 1 || sp.block_size % page != 0 || sp.top_k_blocks < 1 || sp.recent_blocks < 1) {
    std::fprintf(stderr, "--block-size must be a multiple of --page; --top-k-blocks and --recent-blocks >= 1\n");
    return 2;
  }
  model::ModelConfig cfg = loaded->config;
  const int decode_steps = N("--decode-steps");
  cfg.max_position_embeddings = std::max(cfg.max_position_embeddings, context + decode_steps + 1);

  // The document: held-out examples as SFT rows until --context tokens.
  const auto& tok = *loaded->tokenizer;
  std::vector<int32_t> doc;
  std::vector<char> is_answer;  // answer characters and the eos after them
  const auto examples = (*task)->EvalExamples(static_cast<uint64_t>(N("--seed")), 4096);
  const bool rows = f.document == "rows";
  for (size_t e = 0; static_cast<int>(doc.size()) < context + decode_steps; ++e) {
    const rl::Example& ex = examples[e % examples.size()];
    if (rows || e == 0) doc.push_back(tok.bos());
    for (int32_t id : tok.Encode(ex.prompt)) doc.push_back(id);
    is_answer.resize(doc.size(), 0);
    for (int32_t id : tok.Encode(ex.answer)) doc.push_back(id);
    if (rows) {
      doc.push_back(tok.eos());
    } else {
      for (int32_t id : tok.Encode(";")) doc.push_back(id);
    }
    is_answer.resize(doc.size(), 1);
  }
  doc.resize(context + decode_steps);

  auto ops = kernels::MakeCpuOps(N("--threads"));
  const model::ParamLayout layout(cfg);
  model::FlatParamProvider pp(layout, loaded->params.data(), nullptr);
  const int positions = context + decode_steps;
  Runner dense(cfg, ops.get(), pp, page, positions, chunk, nullptr);
  Runner sparse(cfg, ops.get(), pp, page, positions, chunk, &sp);
  const int V = cfg.vocab_size;
  const int span = (sp.sink_blocks + sp.recent_blocks + sp.top_k_blocks) * sp.block_size;
  int64_t measured = 0, agree = 0, ans = 0, ans_agree = 0, ans_dense = 0, ans_sparse = 0;
  double kl_sum = 0, kl_max = 0, ans_kl = 0;
  std::vector<double> lp, lq;
  double t_dense = 0, t_sparse = 0;
  for (int start = 0; start < context; start += chunk) {
    const int n = std::min(chunk, context - start);
    const std::vector<int32_t> ids(doc.begin() + start, doc.begin() + start + n);
    double t0 = Now();
    const float* ld = dense.Run(ids, start);
    std::vector<float> dense_logits(ld, ld + static_cast<size_t>(n) * V);
    t_dense += Now() - t0;
    t0 = Now();
    const float* ls = sparse.Run(ids, start);
    t_sparse += Now() - t0;
    for (int i = 0; i < n; ++i) {
      const int p = start + i;
      if (p < span || p + 1 >= static_cast<int>(doc.size())) continue;
      const float* a = dense_logits.data() + static_cast<size_t>(i) * V;
      const float* b = ls + static_cast<size_t>(i) * V;
      LogSoftmax(a, V, &lp);
      LogSoftmax(b, V, &lq);
      double kl = 0;
      for (int v = 0; v < V; ++v) kl += std::exp(lp[v]) * (lp[v] - lq[v]);
      kl_sum += kl;
      kl_max = std::max(kl_max, kl);
      ++measured;
      const int ad = Argmax(a, V), as = Argmax(b, V);
      agree += ad == as;
      if (is_answer[p + 1]) {
        ++ans;
        ans_agree += ad == as;
        ans_kl += kl;
        ans_dense += ad == doc[p + 1];
        ans_sparse += as == doc[p + 1];
      }
    }
    std::fprintf(stderr, "\r%d / %d positions", start + n, context);
  }
  std::fprintf(stderr, "\n");
  // One-token decode steps at the end of the document.
  double step_dense = 0, step_sparse = 0;
  for (int s = 0; s < decode_steps; ++s) {
    const std::vector<int32_t> one{doc[context + s]};
    double t0 = Now();
    dense.Run(one, context + s);
    step_dense += Now() - t0;
    t0 = Now();
    sparse.Run(one, context + s);
    step_sparse += Now() - t0;
  }
  std::printf("model %s: %d layers, hidden %d, %d heads (%d kv), vocab %d; task %s %d-%d\n", f.model.c_str(),
              cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, V,
              f.task.c_str(), N("--min-len"), N("--max-len"));
  std::printf("sparse: blocks of %d, %d sink + %d recent + top %d (dense span %d positions); pages of %d\n",
              sp.block_size, sp.sink_blocks, sp.recent_blocks, sp.top_k_blocks, span, page);
  std::printf(
      "| context | positions measured | top-1 agreement | mean KL | max KL | answer positions | answer "
      "top-1 agreement | answer mean KL | answer exact dense | answer exact sparse | prefill s dense | prefill s "
      "sparse | decode step ms dense | decode step ms sparse |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  const double m = std::max<int64_t>(measured, 1), a = std::max<int64_t>(ans, 1);
  std::printf("| %d | %lld | %.4f | %.2e | %.2e | %lld | %.4f | %.2e | %.4f | %.4f | %.2f | %.2f | %.3f | %.3f |\n",
              context, static_cast<long long>(measured), agree / m, kl_sum / m, kl_max, static_cast<long long>(ans),
              ans_agree / a, ans_kl / a, ans_dense / a, ans_sparse / a, t_dense, t_sparse,
              1e3 * step_dense / std::max(decode_steps, 1), 1e3 * step_sparse / std::max(decode_steps, 1));
  return 0;
}
