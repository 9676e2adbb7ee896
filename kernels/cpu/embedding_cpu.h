// Fast CPU embedding lookup and its gradient. Forward: OpenMP over tokens.
// Backward: OpenMP over column blocks (each thread owns a slice of every
// table row), so repeated ids never race and results are deterministic.
#pragma once

#include <cstdint>

namespace tandem::kernels::cpu {

void embedding_forward(const int32_t* ids, int t, const float* table, int c, float* out);
void embedding_backward(const int32_t* ids, int t, const float* dout, int c, float* dtable);

}  // namespace tandem::kernels::cpu
