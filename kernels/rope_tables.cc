// Host-side rotary tables shared by every backend: inv_freq and cos/sin,
// following Hugging Face's ROPE_INIT_FUNCTIONS (default, linear, dynamic, yarn,
// llama3).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/ops.h"

namespace tandem::kernels {

namespace {
// YaRN helpers (HF _compute_yarn_parameters).
double YarnFindCorrectionDim(double num_rotations, int dim, double base, int max_pos) {
  return (dim * std::log(max_pos / (num_rotations * 2 * M_PI))) / (2 * std::log(base));
}
}  // namespace

void rope_inv_freq(const RopeConfig& cfg, int seq_len, float* inv_freq, float* attention_scaling) {
  const int dim = cfg.head_dim;
  const int half = dim / 2;
  double base = cfg.theta;
  double scaling = 1.0;
  switch (cfg.type) {
    case RopeType::kDefault:
    case RopeType::kLinear:
    case RopeType::kLlama3:
      break;
    case RopeType::kDynamicNtk: {
      // HF: seq_len = max(seq_len, max_position_embeddings);
      // base = base * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2))
      const double max_pos = cfg.original_max_position;
      const double sl = std::max<double>(seq_len, max_pos);
      base = base * std::pow((cfg.factor * sl / max_pos) - (cfg.factor - 1.0), static_cast<double>(dim) / (dim - 2));
      break;
    }
    case RopeType::kYarn: {
      scaling =
          cfg.attention_factor > 0 ? cfg.attention_factor : (cfg.factor <= 1 ? 1.0 : 0.1 * std::log(cfg.factor) + 1.0);
      double low = std::floor(YarnFindCorrectionDim(cfg.beta_fast, dim, base, cfg.original_max_position));
      double high = std::ceil(YarnFindCorrectionDim(cfg.beta_slow, dim, base, cfg.original_max_position));
      low = std::max(low, 0.0);
      high = std::min(high, static_cast<double>(dim - 1));
      if (low == high) high += 0.001;  // HF: prevent singularity
      for (int i = 0; i < half; ++i) {
        const double pos_freq = std::pow(base, (2.0 * i) / dim);
        const double extrapolation = 1.0 / pos_freq;
        const double interpolation = 1.0 / (cfg.factor * pos_freq);
        double ramp = (i - low) / (high - low);
        ramp = std::clamp(ramp, 0.0, 1.0);
        const double extrapolation_factor = 1.0 - ramp;
        inv_freq[i] =
            static_cast<float>(interpolation * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor);
      }
      *attention_scaling = static_cast<float>(scaling);
      return;
    }
  }
  for (int i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(base, (2.0 * i) / dim);
    if (cfg.type == RopeType::kLinear) f /= cfg.factor;
    inv_freq[i] = static_cast<float>(f);
  }
  if (cfg.type == RopeType::kLlama3) {
    // HF _compute_llama3_parameters, on the fp32 default frequencies and in
    // fp32 as HF computes it: wavelengths shorter than old/high_freq_factor
    // are kept, longer than old/low_freq_factor divided by factor, and in
    // between interpolated by a smooth factor linear in old/wavelength.
    const float factor = static_cast<float>(cfg.factor);
    const float low = static_cast<float>(cfg.low_freq_factor);
    const float high = static_cast<float>(cfg.high_freq_factor);
    const float old_len = static_cast<float>(cfg.original_max_position);
    const double low_freq_wavelen = cfg.original_max_position / cfg.low_freq_factor;
    const double high_freq_wavelen = cfg.original_max_position / cfg.high_freq_factor;
    for (int i = 0; i < half; ++i) {
      const float f = inv_freq[i];
      const float wavelen = static_cast<float>(2 * M_PI) / f;
      if (wavelen < high_freq_wavelen) continue;
      if (wavelen > low_freq_wavelen) {
        inv_freq[i] = f / factor;
        continue;
      }
      const float smooth = (old_len / wavelen - low) / (high - low);
      inv_freq[i] = (1.f - smooth) * f / factor + smooth * f;
    }
  }
  *attention_scaling = static_cast<float>(scaling);
}

void rope_tables(const RopeConfig& cfg, int seq_len, int max_pos, float* cos, float* sin) {
  const int half = cfg.head_dim / 2;
  std::vector<float> inv_freq(half);
  float attention_scaling = 1.f;
  rope_inv_freq(cfg, seq_len, inv_freq.data(), &attention_scaling);
  for (int p = 0; p < max_pos; ++p) {
    for (int i = 0; i < half; ++i) {
      // HF computes freqs in fp32: position * inv_freq (float).
      const float angle = static_cast<float>(p) * inv_freq[i];
      const size_t at = static_cast<size_t>(p) * half + i;
      cos[at] = std::cos(angle) * attention_scaling;
      sin[at] = std::sin(angle) * attention_scaling;
    }
  }
}

}  // namespace tandem::kernels
