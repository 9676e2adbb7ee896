// Decoder: the activations' placement (per-layer slices for a backward, or
// one scratch per activation reused by every layer and the residual updated
// in place) does not change a bit of the output, and a forward allocates no
// memory once the caller's buffers exist.
#include "worker/model/decoder.h"

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backends.h"
#include "worker/model/model.h"

namespace {

std::atomic<long> g_allocations{0};

}  // namespace

// Counts every heap allocation of the test binary.
void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace tandem::model {
namespace {

ModelConfig Config(const char* type) {
  ModelConfig c;
  c.model_type = type;
  c.vocab_size = 61;
  c.hidden_size = 48;
  c.intermediate_size = 80;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 128;
  if (c.model_type == "qwen3") c.head_dim = 16;  // != hidden / heads
  if (c.model_type == "mistral") {
    c.sliding_window = 4;
    c.sliding_window_set = true;
  }
  return c;
}

// Device buffers for one forward of `rows` tokens, laid out per layer
// (stride = one layer's rows) or as one shared scratch (stride 0).
struct Buffers {
  Buffers(const DecoderDims& d, int rows, bool per_layer, kernels::DeviceMemory* mem) {
    const size_t r = rows;
    const size_t layers = per_layer ? d.L : 1;
    auto make = [&](kernels::DeviceArray<float>& a, size_t width, size_t copies) {
      EXPECT_TRUE(a.AllocateZeroed(mem, copies * r * width));
      return LayerBuffer{a.data(), per_layer ? r * width : 0};
    };
    acts.x = make(x, d.C, per_layer ? layers + 1 : 1);
    acts.xmid = per_layer ? make(xmid, d.C, layers) : acts.x;
    acts.q = make(q, d.HD, layers);
    acts.k = make(k, d.KD, layers);
    acts.v = make(v, d.KD, layers);
    acts.attn = make(attn, d.HD, layers);
    acts.lse = make(lse, d.H, layers);
    acts.rstd_in = make(rstd_in, 1, layers);
    acts.rstd_post = make(rstd_post, 1, layers);
    acts.gate = make(gate, d.I, layers);
    acts.up = make(up, d.I, layers);
    acts.q_raw = make(q_raw, d.HD, layers);
    acts.k_raw = make(k_raw, d.KD, layers);
    acts.rstd_q = make(rstd_q, d.H, layers);
    acts.rstd_k = make(rstd_k, d.Hkv, layers);
    EXPECT_TRUE(xn.Allocate(mem, r * d.C));
    EXPECT_TRUE(hact.Allocate(mem, r * d.I));
    EXPECT_TRUE(out.Allocate(mem, r * d.C));
    EXPECT_TRUE(rstd.Allocate(mem, r));
    acts.xn = xn.data();
    acts.hact = hact.data();
  }
  kernels::DeviceArray<float> x, xmid, q, k, v, attn, lse, rstd_in, rstd_post, gate, up, q_raw, k_raw, rstd_q, rstd_k,
      xn, hact, out, rstd;
  DecoderActivations acts;
};

struct Fixture {
  explicit Fixture(const ModelConfig& c) : ops(kernels::MakeCpuOps(1)), decoder(c, ops.get(), nullptr) {
    Model init(c, ops.get());
    params.resize(init.layout().total_floats());
    init.InitParams(5, params.data());
    // Two packed sequences of 7 and 5 tokens.
    for (int i = 0; i < 7; ++i) {
      tokens.push_back((3 * i + 1) % c.vocab_size);
      positions.push_back(i);
    }
    for (int i = 0; i < 5; ++i) {
      tokens.push_back((5 * i + 2) % c.vocab_size);
      positions.push_back(i);
    }
    cu = {0, 7, 12};
  }
  int rows() const { return static_cast<int>(tokens.size()); }

  // The final norm's output [rows, C] with the given activation layout.
  std::vector<float> Run(Buffers& b) {
    FlatParamProvider pp(decoder.layout(), params.data(), nullptr);
    DecoderInput in;
    in.rows = rows();
    in.tokens = tokens.data();
    in.positions = positions.data();
    in.cu = cu.data();
    in.num_seqs = 2;
    DecoderOutput out;
    out.rows = rows();
    out.xn = b.out.data();
    out.rstd = b.rstd.data();
    decoder.Forward(pp, in, b.acts, out);
    return std::vector<float>(b.out.data(), b.out.data() + b.out.size());
  }

  std::unique_ptr<kernels::Ops> ops;
  Decoder decoder;
  std::vector<float> params;
  std::vector<int32_t> tokens, positions, cu;
};

class DecoderTest : public ::testing::TestWithParam<const char*> {};

TEST_P(DecoderTest, PerLayerAndSharedScratchGiveTheSameBits) {
  Fixture f(Config(GetParam()));
  ASSERT_TRUE(f.decoder.EnsureRope(f.rows()).ok());
  Buffers kept(f.decoder.dims(), f.rows(), /*per_layer=*/true, f.decoder.memory());
  Buffers shared(f.decoder.dims(), f.rows(), /*per_layer=*/false, f.decoder.memory());
  const std::vector<float> a = f.Run(kept);
  const std::vector<float> b = f.Run(shared);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "element " << i;
  // The per-layer residual stream holds every layer's input: layer 0's is
  // the embedding of the tokens.
  const float* embed = f.params.data() + f.decoder.layout().embed_offset();
  const int C = f.decoder.dims().C;
  for (int t = 0; t < f.rows(); ++t) {
    for (int c = 0; c < C; ++c) {
      ASSERT_EQ(kept.acts.x.at(0)[t * C + c], embed[f.tokens[t] * C + c]);
    }
  }
}

TEST_P(DecoderTest, ForwardAllocatesNothing) {
  Fixture f(Config(GetParam()));
  const DecoderDims& d = f.decoder.dims();
  const int capacity = 16;
  ASSERT_TRUE(f.decoder.EnsureRope(capacity).ok());
  Buffers b(d, f.rows(), /*per_layer=*/false, f.decoder.memory());
  FlatParamProvider pp(f.decoder.layout(), f.params.data(), nullptr);
  // A KV cache of two slots; the prefill writes both prompts into it.
  std::vector<kernels::DeviceArray<float>> kc(d.L), vc(d.L);
  for (int l = 0; l < d.L; ++l) {
    ASSERT_TRUE(kc[l].AllocateZeroed(f.decoder.memory(), 2 * capacity * d.KD));
    ASSERT_TRUE(vc[l].AllocateZeroed(f.decoder.memory(), 2 * capacity * d.KD));
  }
  const KvCache cache{kc, vc, capacity};
  std::vector<int32_t> kv_rows;
  for (int t = 0; t < f.rows(); ++t) kv_rows.push_back((t < 7 ? 0 : capacity) + f.positions[t]);
  DecoderInput prefill;
  prefill.rows = f.rows();
  prefill.tokens = f.tokens.data();
  prefill.positions = f.positions.data();
  prefill.cu = f.cu.data();
  prefill.num_seqs = 2;
  DecoderOutput out;
  out.rows = f.rows();
  out.xn = b.out.data();
  out.rstd = b.rstd.data();
  // One decode step: the next token of each sequence.
  const std::vector<int32_t> next = {4, 9}, next_pos = {7, 5}, next_rows = {7, capacity + 5}, lengths = {8, 6};
  DecoderInput decode;
  decode.rows = 2;
  decode.tokens = next.data();
  decode.positions = next_pos.data();
  decode.cache = &cache;
  decode.kv_rows = next_rows.data();
  decode.cache_len = lengths.data();
  DecoderOutput decode_out = out;
  decode_out.rows = 2;

  f.decoder.Forward(pp, prefill, b.acts, out);  // warm-up
  const long before = g_allocations.load();
  f.decoder.Forward(pp, prefill, b.acts, out);
  f.decoder.Logits(pp, b.out.data(), 1, b.hact.data());  // V <= I: fits
  prefill.cache = &cache;
  prefill.kv_rows = kv_rows.data();
  f.decoder.Forward(pp, prefill, b.acts, out);
  f.decoder.Forward(pp, decode, b.acts, decode_out);
  // Tables already cover these positions: nothing is rebuilt.
  const bool rope_ok = f.decoder.EnsureRope(capacity).ok();
  const long during = g_allocations.load() - before;
  EXPECT_TRUE(rope_ok);
  EXPECT_EQ(during, 0);
  // The counter sees allocations.
  auto* volatile probe = new std::vector<int>(3);
  EXPECT_GT(g_allocations.load() - before, 0);
  delete probe;
}

INSTANTIATE_TEST_SUITE_P(Layouts, DecoderTest, ::testing::Values("llama", "mistral", "qwen2", "qwen3"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace tandem::model
