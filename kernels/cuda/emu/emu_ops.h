// The CUDA emulator as an Ops backend (test-only): the ops whose CUDA kernels
// cooperate within a block (attention forward/backward, decode attention,
// RMSNorm, the LM head's row kernels, sum_squares, AdamW, sampling, blockwise
// int8 quantisation) run the very device code of kernels/cuda/*_kernel.cuh on
// the CPU emulator of cuda_emu.h, launched as CudaOps launches them (int8
// quantisation with fewer blocks, so its grid-stride loop runs). GEMMs (cuBLAS on a GPU) run
// on the reference backend. Host pointers; one thread at a time.
#pragma once

#include <memory>
#include <string>

#include "kernels/ops.h"

namespace tandem::kernels {

std::unique_ptr<Ops> MakeEmuOps();

// Op families (kernels/tests/op_cases.h) with emulated kernels; calling any
// other op of an EmuOps aborts with the op's name.
bool EmuSupports(const std::string& op_family);

}  // namespace tandem::kernels
