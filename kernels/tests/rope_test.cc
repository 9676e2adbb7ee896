// rope_inv_freq / rope_tables against values computed independently from
// Hugging Face's ROPE_INIT_FUNCTIONS formulas (default, linear, dynamic, yarn,
// llama3),
// and rope_apply against HF's apply_rotary_pos_emb written out by hand.
// Expected numbers: a direct re-implementation of transformers'
// modeling_rope_utils in PyTorch 1.13 (fp32, as HF computes them), run once
// with /usr/bin/python3; the script is reproduced in docs/kernels.md.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "kernels/backends.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {

std::vector<std::unique_ptr<Ops>> Backends() {
  std::vector<std::unique_ptr<Ops>> v;
  v.push_back(MakeReferenceOps());
  v.push_back(MakeCpuOps(2));
  return v;
}

struct Expected {
  int index;
  double value;
};

void CheckInvFreq(const RopeConfig& cfg, int seq_len, const std::vector<Expected>& expected, double scaling) {
  std::vector<float> inv(cfg.head_dim / 2);
  float attn = 0.f;
  rope_inv_freq(cfg, seq_len, inv.data(), &attn);
  EXPECT_NEAR(attn, scaling, 1e-6 * scaling);
  for (const Expected& e : expected) {
    EXPECT_NEAR(inv[e.index], e.value, 2e-6 * e.value) << "index " << e.index;
  }
}

TEST(RopeInvFreq, Default) {
  RopeConfig cfg;
  cfg.head_dim = 8;
  CheckInvFreq(cfg, 0, {{0, 1.0}, {1, 0.10000000149011612}, {2, 0.009999999776482582}, {3, 0.0010000000474974513}},
               1.0);
}

TEST(RopeInvFreq, Linear) {
  RopeConfig cfg;
  cfg.head_dim = 8;
  cfg.type = RopeType::kLinear;
  cfg.factor = 4.0;
  CheckInvFreq(cfg, 0, {{0, 0.25}, {1, 0.02500000037252903}, {2, 0.0024999999441206455}, {3, 0.0002500000118743628}},
               1.0);
}

TEST(RopeInvFreq, DynamicNtk) {
  RopeConfig cfg;
  cfg.head_dim = 8;
  cfg.type = RopeType::kDynamicNtk;
  cfg.factor = 2.0;
  cfg.original_max_position = 16;
  // seq_len 32 > 16: base = 1e4 * (2 * 32 / 16 - 1)^(8 / 6).
  CheckInvFreq(cfg, 32, {{0, 1.0}, {1, 0.06933612376451492}, {2, 0.0048074983060359955}, {3, 0.00033333332976326346}},
               1.0);
  // seq_len below the original maximum: unscaled.
  CheckInvFreq(cfg, 10, {{1, 0.10000000149011612}, {3, 0.0010000000474974513}}, 1.0);
}

TEST(RopeInvFreq, Yarn) {
  RopeConfig cfg;
  cfg.head_dim = 64;
  cfg.type = RopeType::kYarn;
  cfg.factor = 4.0;
  cfg.original_max_position = 2048;
  // Correction range low 8, high 21; mscale 0.1 ln 4 + 1.
  CheckInvFreq(cfg, 0,
               {{0, 1.0},
                {5, 0.23713736236095428},
                {10, 0.049745574593544006},
                {15, 0.00794983934611082},
                {16, 0.005384615156799555},
                {20, 0.0009730085730552673},
                {25, 0.00018747354624792933},
                {31, 3.333803761051968e-05}},
               1.138629436111989);
  // Llama-3-like: theta 5e5, D 128, factor 8, original 8192 (range 18..35).
  cfg.head_dim = 128;
  cfg.theta = 500000.0;
  cfg.factor = 8.0;
  cfg.original_max_position = 8192;
  CheckInvFreq(cfg, 0,
               {{0, 1.0},
                {10, 0.12868738174438477},
                {20, 0.01485569030046463},
                {30, 0.000814839790109545},
                {40, 3.428102354519069e-05},
                {50, 4.411534519022098e-06},
                {63, 3.068925877869333e-07}},
               1.2079441541679836);
  // An explicit attention_factor overrides the default mscale.
  cfg.attention_factor = 0.5;
  std::vector<float> inv(64);
  float attn = 0.f;
  rope_inv_freq(cfg, 0, inv.data(), &attn);
  EXPECT_FLOAT_EQ(attn, 0.5f);
}

TEST(RopeInvFreq, Llama3) {
  // Llama 3.1 8B: theta 5e5, D 128, factor 8, low 1, high 4, original 8192.
  // Indices 0..28: wavelength < 2048, kept; 29..34: interpolated; 35..63:
  // wavelength > 8192, divided by 8. No attention scaling.
  RopeConfig cfg;
  cfg.head_dim = 128;
  cfg.theta = 500000.0;
  cfg.type = RopeType::kLlama3;
  cfg.factor = 8.0;
  cfg.low_freq_factor = 1.0;
  cfg.high_freq_factor = 4.0;
  cfg.original_max_position = 8192;
  CheckInvFreq(cfg, 0,
               {{0, 1.0},
                {10, 0.12868738174438477},
                {20, 0.016560440883040428},
                {28, 0.0032114461064338684},
                {29, 0.0021665706299245358},
                {30, 0.0013718936825171113},
                {32, 0.0005248460220173001},
                {34, 0.0001785077911335975},
                {35, 9.556212171446532e-05},
                {36, 7.784655463183299e-05},
                {63, 3.068925877869333e-07}},
               1.0);
  // Llama 3.2 1B: D 64, factor 32.
  cfg.head_dim = 64;
  cfg.factor = 32.0;
  CheckInvFreq(cfg, 0,
               {{0, 1.0},
                {8, 0.03760603070259094},
                {12, 0.00729266507551074},
                {14, 0.0032114461064338684},
                {16, 0.000429556705057621},
                {20, 8.570255886297673e-06},
                {31, 9.418306490260875e-08}},
               1.0);
}

TEST(RopeTables, YarnCosSinIncludeScaling) {
  RopeConfig cfg;
  cfg.head_dim = 64;
  cfg.type = RopeType::kYarn;
  cfg.factor = 4.0;
  cfg.original_max_position = 2048;
  const int max_pos = 1001, half = 32;
  std::vector<float> cos(max_pos * half), sin(max_pos * half);
  rope_tables(cfg, 0, max_pos, cos.data(), sin.data());
  struct Row {
    int pos;
    double c0, c15, c31, s0, s15, s31;
  };
  const Row rows[] = {
      {0, 1.13862943649292, 1.13862943649292, 1.13862943649292, 0, 0, 0},
      {1, 0.6152041554450989, 1.1385934352874756, 1.13862943649292, 0.9581236243247986, 0.009051825851202011,
       3.795967131736688e-05},
      {7, 0.8584153056144714, 1.136866807937622, 1.13862943649292, 0.7480642795562744, 0.0633307471871376,
       0.0002657177101355046},
      {1000, 0.6403413414955139, -0.10897907614707947, 1.137996792793274, 0.9415094256401062, 1.1334022283554077,
       0.03795263543725014},
  };
  for (const Row& r : rows) {
    const float* c = cos.data() + r.pos * half;
    const float* s = sin.data() + r.pos * half;
    EXPECT_NEAR(c[0], r.c0, 2e-6) << r.pos;
    EXPECT_NEAR(c[15], r.c15, 2e-6) << r.pos;
    EXPECT_NEAR(c[31], r.c31, 2e-6) << r.pos;
    EXPECT_NEAR(s[0], r.s0, 2e-6) << r.pos;
    EXPECT_NEAR(s[15], r.s15, 2e-6) << r.pos;
    EXPECT_NEAR(s[31], r.s31, 2e-6) << r.pos;
  }
}

// HF: q_embed = q * cos + rotate_half(q) * sin, rotate_half(x) = [-x2, x1],
// with cos/sin the half tables repeated twice along D.
TEST(RopeApply, MatchesHfRotateHalf) {
  RopeConfig cfg;
  cfg.head_dim = 4;  // inv_freq = [1, 0.01]
  const int max_pos = 4;
  std::vector<float> cos(max_pos * 2), sin(max_pos * 2);
  rope_tables(cfg, 0, max_pos, cos.data(), sin.data());
  const float x0[4] = {1.f, 2.f, 3.f, 4.f};
  const int32_t pos = 3;
  const double a = 3.0, b = 0.03;  // position * inv_freq
  const double expected[4] = {1 * std::cos(a) - 3 * std::sin(a), 2 * std::cos(b) - 4 * std::sin(b),
                              3 * std::cos(a) + 1 * std::sin(a), 4 * std::cos(b) + 2 * std::sin(b)};
  for (const auto& ops : Backends()) {
    float x[4] = {x0[0], x0[1], x0[2], x0[3]};
    ops->rope_apply(x, &pos, 1, 1, 4, cos.data(), sin.data(), false);
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(x[i], expected[i], 1e-6) << ops->name();
    // Unscaled rope is orthogonal: the inverse undoes it.
    ops->rope_apply(x, &pos, 1, 1, 4, cos.data(), sin.data(), true);
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(x[i], x0[i], 1e-6) << ops->name();
  }
}

}  // namespace
}  // namespace tandem::kernels
