#include "worker/rollout/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::rollout {
namespace {

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

RolloutEngine::RolloutEngine(const model::ModelConfig& config, kernels::Ops* ops, kernels::DeviceMemory* memory)
    : RolloutEngine(std::make_unique<PagedDecoder>(config, ops, memory), ops) {}

RolloutEngine::RolloutEngine(std::unique_ptr<BatchForward> forward, kernels::Ops* ops)
    : forward_(std::move(forward)),
      ops_(ops),
      mem_(forward_->memory()),
      vocab_(forward_->vocab()),
      hidden_(forward_->hidden()),
      max_positions_(forward_->max_positions()) {}

void RolloutEngine::Release() {
  kv_.Release();
  forward_->Release();
  idx_d_.reset();
  u_d_.reset();
  pick_id_d_.reset();
  pick_lp_d_.reset();
  seen_d_.reset();
  context_d_.reset();
  for (auto* v : {&idx_, &pick_id_, &ctx_rows_, &ctx_src_, &seen_}) {
    v->clear();
    v->shrink_to_fit();
  }
  pick_lp_.clear();
  pick_lp_.shrink_to_fit();
  u_.clear();
  u_.shrink_to_fit();
}

size_t RolloutEngine::held_bytes() const {
  return kv_.bytes() + forward_->scratch_bytes() + idx_d_.bytes() + u_d_.bytes() + pick_id_d_.bytes() +
         pick_lp_d_.bytes() + seen_d_.bytes() + context_d_.bytes();
}

absl::Status RolloutEngine::Check(const std::vector<RolloutRequest>& requests, const RolloutOptions& o) const {
  RETURN_IF_ERROR(ValidateSampling(o.sampling));
  if (o.max_new_tokens < 0) return absl::InvalidArgumentError("rollout: max_new_tokens < 0");
  if (o.block_size < 1 || o.block_size > 1024) {
    return absl::InvalidArgumentError("rollout.block_size must be in [1, 1024]");
  }
  if (o.max_batch_tokens < 1) return absl::InvalidArgumentError("rollout.max_batch_tokens must be >= 1");
  if (o.max_seqs < 1) return absl::InvalidArgumentError("rollout.max_seqs must be >= 1");
  if (o.sparse) {
    const kernels::SparseDecodeParams& s = *o.sparse;
    if (s.top_k_blocks < 1 || s.sink_blocks < 0 || s.recent_blocks < 1) {
      return absl::InvalidArgumentError(
          "rollout.sparse needs top_k_blocks >= 1, sink_blocks >= 0 and recent_blocks >= 1");
    }
    if (s.block_size < o.block_size || s.block_size % o.block_size != 0) {
      return absl::InvalidArgumentError(absl::StrCat("rollout.sparse.block_size ", s.block_size,
                                                     " is not a multiple of rollout.block_size ", o.block_size));
    }
    if (!forward_->supports_sparse()) {
      return absl::UnimplementedError(
          "rollout.sparse: this rollout forward has no sparse attention; leave rollout.sparse.top_k_blocks at 0");
    }
  }
  if (requests.empty()) return absl::InvalidArgumentError("rollout: no requests");
  for (int l = 0; l < forward_->num_layers(); ++l) {
    const model::LayerType& t = forward_->layer_type(l);
    if (t.kind == model::LayerKind::kLinear && forward_->linear_state_floats() == 0) {
      return absl::UnimplementedError(absl::StrCat("rollout: layer ", l,
                                                   " is 'linear', which this rollout forward does not run (a "
                                                   "tensor-parallel forward needs rollout.tp_size 1 for it)"));
    }
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& p = requests[i].prompt;
    RETURN_IF_ERROR(CheckContext(requests[i], i, o));
    if (p.empty() && requests[i].context.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("rollout: prompt ", i, " is empty"));
    }
    if (p.size() + static_cast<size_t>(o.max_new_tokens) > (size_t{1} << 22)) {
      return absl::InvalidArgumentError(absl::StrCat("rollout: prompt ", i, " is too long"));
    }
    const int ids = forward_->input_vocab();
    for (int32_t id : p) {
      if (id < 0 || id >= ids) {
        return absl::InvalidArgumentError(
            absl::StrCat("rollout: prompt ", i, " has token id ", id, " outside [0, ", ids, ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status RolloutEngine::CheckContext(const RolloutRequest& r, size_t i, const RolloutOptions& o) const {
  const std::vector<float>& c = r.context;
  if (c.empty()) return absl::OkStatus();
  const size_t hidden = static_cast<size_t>(hidden_);
  if (c.size() % hidden != 0) {
    return absl::InvalidArgumentError(absl::StrCat("rollout: request ", i, ": context embeddings of ", c.size(),
                                                   " values are not rows of the model's hidden size ", hidden));
  }
  const size_t n = c.size() / hidden;
  const size_t limit = static_cast<size_t>(std::max(max_positions_, 0));
  if (n > limit || r.prompt.size() > limit - n || static_cast<size_t>(o.max_new_tokens) > limit - n - r.prompt.size()) {
    return absl::InvalidArgumentError(absl::StrCat("rollout: request ", i, ": ", n, " context rows + ", r.prompt.size(),
                                                   " prompt tokens + ", o.max_new_tokens,
                                                   " new tokens exceed the model's context of ", limit, " positions"));
  }
  for (size_t k = 0; k < c.size(); ++k) {
    if (!std::isfinite(c[k])) {
      return absl::InvalidArgumentError(absl::StrCat("rollout: request ", i, ": context embedding row ", k / hidden,
                                                     ", column ", k % hidden, " is ", c[k], " (must be finite)"));
    }
  }
  return absl::OkStatus();
}

absl::Status RolloutEngine::Ensure(int rows, int outs, int positions, size_t index_ints) {
  RETURN_IF_ERROR(forward_->Reserve(rows, outs, positions));
  auto exhausted = [&](const char* what) {
    Release();
    return absl::ResourceExhaustedError(
        absl::StrCat("rollout: cannot allocate ", what, " in ", mem_->name(), " memory"));
  };
  if (idx_d_.size() < index_ints && !idx_d_.Allocate(mem_, index_ints)) return exhausted("indices");
  if (u_d_.size() < static_cast<size_t>(outs)) {
    if (!u_d_.Allocate(mem_, outs) || !pick_id_d_.Allocate(mem_, outs) ||
        !pick_lp_d_.Allocate(mem_, 2 * static_cast<size_t>(outs))) {
      return exhausted("sampling buffers");
    }
  }
  idx_.reserve(index_ints);
  u_.resize(outs);
  pick_id_.resize(outs);
  pick_lp_.resize(2 * static_cast<size_t>(outs));
  return absl::OkStatus();
}

absl::StatusOr<RolloutResult> RolloutEngine::Generate(const std::vector<RolloutRequest>& requests,
                                                      const RolloutOptions& o, model::ParamProvider& params) {
  RETURN_IF_ERROR(Check(requests, o));
  const double t0 = Now();
  RolloutResult res;
  res.sequences.resize(requests.size());
  size_t context_floats = 0;
  for (const auto& r : requests) {
    res.prompt_tokens += static_cast<int64_t>(r.prompt.size());
    context_floats += r.context.size();
  }
  res.context_rows = static_cast<int64_t>(context_floats / static_cast<size_t>(hidden_));
  if (o.max_new_tokens == 0) return res;
  // Context rows enter the scheduler as ids -1 - (row in context_d_): they
  // take blocks and positions like tokens, and the forward reads their
  // embedding from context_d_.
  if (context_floats > 0) {
    if (context_d_.size() < context_floats && !context_d_.Allocate(mem_, context_floats)) {
      context_d_.reset();
      return absl::ResourceExhaustedError(absl::StrCat("rollout: cannot allocate ", context_floats * sizeof(float),
                                                       " bytes of context embeddings in ", mem_->name(), " memory"));
    }
    size_t at = 0;
    for (const auto& r : requests) {
      context_d_.Upload(r.context.data(), r.context.size(), at);
      at += r.context.size();
    }
  }
  auto sequence_of = [&](const RolloutRequest& r, int32_t* next_row) {
    const int32_t n = static_cast<int32_t>(r.context.size() / static_cast<size_t>(hidden_));
    std::vector<int32_t> seq;
    seq.reserve(static_cast<size_t>(n) + r.prompt.size());
    for (int32_t k = 0; k < n; ++k) seq.push_back(-1 - (*next_row + k));
    *next_row += n;
    seq.insert(seq.end(), r.prompt.begin(), r.prompt.end());
    return seq;
  };

  const int layers = forward_->num_layers(), kv_dim = forward_->kv_dim();
  KvPlanRequest want;
  for (int l = 0; l < layers; ++l) want.layers.push_back(forward_->layer_type(l));
  want.kv_dim = kv_dim;
  want.linear_state_floats = forward_->linear_state_floats();
  for (const auto& r : requests) {
    want.positions.push_back(static_cast<int64_t>(r.context.size() / static_cast<size_t>(hidden_) + r.prompt.size()) +
                             o.max_new_tokens);
  }
  want.kv_cache_bytes = o.kv_cache_bytes;
  want.dtype = o.kv_dtype;
  want.block_size = o.block_size;
  want.max_batch_tokens = o.max_batch_tokens;
  want.max_seqs = o.max_seqs;
  want.summaries = o.sparse.has_value();
  ASSIGN_OR_RETURN(const KvPlan plan, PlanKvCache(want));
  const int state_slots = plan.state_slots;
  const int S = std::min<int>(o.max_seqs, static_cast<int>(requests.size()));

  SchedulerOptions so;
  so.num_blocks = plan.num_blocks;
  so.block_size = o.block_size;
  so.max_batch_tokens = o.max_batch_tokens;
  so.max_seqs = o.max_seqs;
  so.share_prompts = o.share_prompts;
  so.static_batch = o.static_batch;
  so.state_slots = state_slots;
  so.window = plan.window;
  so.sinks = plan.sinks;
  so.windowed = {plan.windowed_blocks, plan.windowed_window, plan.windowed_sinks};
  Scheduler sched(so);
  int32_t next_row = 0;
  for (const auto& r : requests) {
    ASSIGN_OR_RETURN(int id, sched.Add(sequence_of(r, &next_row), r.context.empty() ? r.group : -1, o.max_new_tokens));
    (void)id;
  }
  if (kv_.num_blocks() != so.num_blocks || kv_.windowed_blocks() != so.windowed.num_blocks ||
      kv_.dtype() != o.kv_dtype || kv_.block_size() != o.block_size || kv_.has_summaries() != want.summaries ||
      kv_.windowed_layers() != plan.windowed) {
    RETURN_IF_ERROR(kv_.Allocate(mem_, layers, kv_dim, o.block_size, so.num_blocks, o.kv_dtype, want.summaries,
                                 plan.has_kv, plan.windowed, so.windowed.num_blocks));
  }
  if (kv_.state_slots() != state_slots) {
    if (absl::Status st = kv_.AllocateStates(plan.has_state, forward_->linear_state_floats(), state_slots); !st.ok()) {
      Release();
      return st;
    }
  }
  const int R = o.max_batch_tokens;
  const int MB = sched.max_blocks_per_seq();
  const int pools = sched.num_pools();
  // [tokens | positions | row_seq | slots] (R each), out rows (S), tables
  // (S x MB), run row offsets (S + 1); with two pools the windowed pool's
  // slots (R) and tables (S x MB) after them.
  const size_t index_ints = 4 * static_cast<size_t>(R) + S + static_cast<size_t>(S) * MB + S + 1 +
                            (pools - 1) * (static_cast<size_t>(R) + static_cast<size_t>(S) * MB);
  RETURN_IF_ERROR(Ensure(R, S, sched.max_positions(), index_ints));

  std::vector<int32_t> stop = o.stop_ids;
  auto is_stop = [&](int32_t t) { return std::find(stop.begin(), stop.end(), t) != stop.end(); };
  const bool filtered = UsesFilters(o.sampling, vocab_);
  const kernels::SampleFilter filter = ToSampleFilter(o.sampling);
  // Repetition penalty: each step uploads [offsets (outs + 1) | seen ids].
  const bool penalty = filtered && o.sampling.repetition_penalty != 1.f;
  if (penalty) {
    const size_t seen_ints = static_cast<size_t>(S) + 1 + static_cast<size_t>(S) * sched.max_positions();
    if (seen_d_.size() < seen_ints && !seen_d_.Allocate(mem_, seen_ints)) {
      Release();
      return absl::ResourceExhaustedError(
          absl::StrCat("rollout: cannot allocate the seen-token list in ", mem_->name(), " memory"));
    }
    seen_.reserve(seen_ints);
  }
  const int bs = o.block_size;
  std::vector<int> table_row(requests.size(), -1);
  Scheduler::Step step;
  while (sched.Schedule(&step)) {
    if (step.rows == 0) {
      return absl::InternalError("rollout: the scheduler planned an empty step");
    }
    const double step_start = Now();
    bool prefill = false;
    for (const Scheduler::Chunk& c : step.chunks) prefill |= c.start < sched.prompt_len(c.seq);
    for (const BlockCopy& c : step.copies) kv_.CopyBlock(c.pool, c.src, c.dst);
    // Host indices, one upload.
    const int rows = step.rows, n_out = static_cast<int>(step.samples.size());
    const int nseq = static_cast<int>(step.chunks.size());
    const size_t pool1_ints = (pools - 1) * (static_cast<size_t>(rows) + static_cast<size_t>(nseq) * MB);
    idx_.assign(4 * static_cast<size_t>(rows) + n_out + static_cast<size_t>(nseq) * MB + nseq + 1 + pool1_ints, 0);
    int32_t* tok = idx_.data();
    int32_t* pos = tok + rows;
    int32_t* rseq = pos + rows;
    int32_t* slot = rseq + rows;
    int32_t* outr = slot + rows;
    int32_t* tables = outr + n_out;
    int32_t* run_rows = tables + static_cast<size_t>(nseq) * MB;
    int32_t* slot1 = run_rows + nseq + 1;
    int32_t* tables1 = slot1 + rows;
    ctx_rows_.clear();
    ctx_src_.clear();
    run_slot_.clear();
    run_start_.clear();
    for (int k = 0; k < nseq; ++k) {
      const Scheduler::Chunk& c = step.chunks[k];
      run_rows[k] = c.row;
      run_rows[k + 1] = c.row + c.n;
      run_slot_.push_back(sched.state_slot(c.seq));
      run_start_.push_back(c.start);
      const auto toks = sched.tokens(c.seq);
      const BlockTable& tb = sched.table(c.seq);
      std::copy(tb.begin(), tb.end(), tables + static_cast<size_t>(k) * MB);
      const BlockTable& tb1 = sched.table(c.seq, pools - 1);
      if (pools > 1) std::copy(tb1.begin(), tb1.end(), tables1 + static_cast<size_t>(k) * MB);
      for (int i = 0; i < c.n; ++i) {
        const int r = c.row + i, p = c.start + i;
        tok[r] = toks[p];
        if (toks[p] < 0) {  // a context row: token 0 is looked up, then replaced
          ctx_rows_.push_back(r);
          ctx_src_.push_back(-1 - toks[p]);
          tok[r] = 0;
        }
        pos[r] = p;
        rseq[r] = k;
        slot[r] = tb[p / bs] * bs + p % bs;
        if (pools > 1) slot1[r] = tb1[p / bs] * bs + p % bs;
      }
    }
    for (int i = 0; i < n_out; ++i) outr[i] = step.samples[i].row;
    idx_d_.Upload(idx_.data(), idx_.size());
    const int32_t* dp = idx_d_.data();
    ForwardBatch fb;
    fb.rows = rows;
    fb.tokens = dp;
    fb.positions = dp + rows;
    fb.row_seq = dp + 2 * rows;
    fb.slots = dp + 3 * rows;
    fb.out_rows = dp + 4 * rows;
    fb.num_out = n_out;
    fb.block_tables = dp + 4 * rows + n_out;
    fb.max_blocks = MB;
    fb.num_context = static_cast<int>(ctx_rows_.size());
    fb.context_rows = ctx_rows_.data();
    fb.context_src = ctx_src_.data();
    fb.context_table = context_d_.data();
    fb.sparse = o.sparse ? &*o.sparse : nullptr;
    if (pools > 1) {
      const int32_t* d1 = fb.block_tables + static_cast<size_t>(nseq) * MB + nseq + 1;
      fb.windowed_slots = d1;
      fb.windowed_block_tables = d1 + rows;
    }
    if (state_slots > 0) {
      fb.num_chunks = nseq;
      fb.chunk_rows = fb.block_tables + static_cast<size_t>(nseq) * MB;
      fb.chunk_rows_host = run_rows;
      fb.chunk_slot = run_slot_.data();
      fb.chunk_start = run_start_.data();
    }
    RETURN_IF_ERROR(forward_->Forward(params, kv_, fb));
    sched.Commit(step);
    // A follower starts from its leader's state at the prompt's end.
    for (const auto& [follower, leader] : step.forks) {
      if (state_slots > 0) kv_.CopyState(sched.state_slot(leader), sched.state_slot(follower));
    }

    // Sampling: stream of each sequence, token index = tokens generated.
    for (int i = 0; i < n_out; ++i) {
      const int s = step.samples[i].seq;
      u_[i] = o.sampling.greedy
                  ? 0.0
                  : StreamUniform(o.sampling.seed, requests[s].stream, static_cast<uint64_t>(sched.generated(s)));
    }
    u_d_.Upload(u_.data(), n_out);
    if (!filtered) {
      ops_->sample_logits(forward_->logits(), n_out, vocab_, filter.temperature, u_d_.data(), pick_id_d_.data(),
                          pick_lp_d_.data(), pick_lp_d_.data() + n_out);
    } else {
      const int32_t* seen_off = nullptr;
      const int32_t* seen = nullptr;
      if (penalty) {
        // Prompt and generated tokens; context rows (negative) are ignored.
        seen_.assign(static_cast<size_t>(n_out) + 1, 0);
        for (int i = 0; i < n_out; ++i) {
          const auto toks = sched.tokens(step.samples[i].seq);
          // Soft-prompt ids (>= vocab_) have no logit to penalize.
          for (int32_t t : toks) {
            if (t < vocab_) seen_.push_back(t);
          }
          seen_[i + 1] = static_cast<int32_t>(seen_.size() - (n_out + 1));
        }
        if (seen_.size() > seen_d_.size()) {
          return absl::InternalError("rollout: a sequence is longer than the scheduler's position limit");
        }
        seen_d_.Upload(seen_.data(), seen_.size());
        seen_off = seen_d_.data();
        seen = seen_d_.data() + n_out + 1;
      }
      ops_->sample_filtered(forward_->logits(), n_out, vocab_, filter, seen_off, seen, u_d_.data(), pick_id_d_.data(),
                            pick_lp_d_.data(), pick_lp_d_.data() + n_out);
    }
    pick_id_d_.Download(pick_id_.data(), n_out);
    pick_lp_d_.Download(pick_lp_.data(), 2 * static_cast<size_t>(n_out));
    for (int i = 0; i < n_out; ++i) {
      const int s = step.samples[i].seq;
      const int32_t t = pick_id_[i];
      RolloutSequence& g = res.sequences[s];
      g.tokens.push_back(t);
      g.logprobs.push_back(pick_lp_[i]);
      g.raw_logprobs.push_back(pick_lp_[n_out + i]);
      sched.Append(s, t);
      bool done = true;
      if (is_stop(t) || (o.stop_check && o.stop_check(static_cast<size_t>(s), t))) {
        g.finish = Finish::kStop;
      } else if (static_cast<int>(g.tokens.size()) >= o.max_new_tokens) {
        g.finish = Finish::kLength;
      } else {
        done = false;
      }
      if (done) sched.Finish(s);
    }
    (prefill ? res.prefill_seconds : res.decode_seconds) += Now() - step_start;
  }
  for (const auto& g : res.sequences) res.generated_tokens += static_cast<int64_t>(g.tokens.size());
  res.scheduler = sched.stats();
  res.num_blocks = so.num_blocks;
  res.windowed_blocks = so.windowed.num_blocks;
  res.kv_pool_bytes = kv_.bytes();
  res.kv_peak_bytes = static_cast<size_t>(sched.blocks(0).peak_used_blocks()) * plan.block_bytes + plan.state_bytes;
  if (pools > 1) {
    res.kv_peak_bytes += static_cast<size_t>(sched.blocks(1).peak_used_blocks()) * plan.windowed_block_bytes;
  }
  res.state_bytes = plan.state_bytes;
  res.seconds = Now() - t0;
  return res;
}

}  // namespace tandem::rollout
