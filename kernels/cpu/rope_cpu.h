// Fast CPU rotary embedding (rotate_half layout, HF apply_rotary_pos_emb),
// in place on x [T, nh, D]; OpenMP over tokens, SIMD over D/2.
#pragma once

#include <cstdint>

namespace tandem::kernels::cpu {

void rope_apply(float* x, const int32_t* positions, int t, int nh, int d, const float* cos, const float* sin,
                bool inverse);

}  // namespace tandem::kernels::cpu
