// The kernel case table: every op of kernels/ops.h over many shapes, written
// once and driven against every backend (the fast CPU backend, the
// cpu-guarded device, the CUDA emulator, real CUDA), each compared with the
// reference backend (kernels/ref). ggml's test-backend-ops is the model.
//
// A case generates its inputs from its own seed, uploads them through the
// backend's DeviceMemory, runs the op and downloads its outputs, so the same
// code runs on host pointers, guarded pointers and CUDA device pointers.
// Inputs a backward op takes from its forward (out, lse, rstd) are computed
// by the reference, so every backend sees the same ones. No GoogleTest here:
// the GPU binary uses the table too.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kernels/memory.h"
#include "kernels/ops.h"

namespace tandem::kernels::testing {

// The bound class of an output; each backend states its bound per class
// (op_check.h).
enum class Bound {
  kExact,        // bit for bit (copies, conversions, token ids)
  kElementwise,  // one rounding per element
  kReduction,    // sums whose order differs between backends
  kUpdate,       // an AdamW update p - p0 (float rounding is ulp(p) / |dp|)
  kDoubleSum,    // a double accumulator (sum_squares)
};

struct Output {
  std::string name;
  Bound bound;
  std::vector<float> values;  // all classes but kDoubleSum
  double scalar = 0.0;        // kDoubleSum
  // For an output that is exactly 0 in exact arithmetic (terms that cancel):
  // the terms' magnitude, below which errors compare absolutely.
  double cancel_scale = 0.0;
};

struct OpCase {
  // The op family ("matmul", "attention", "lm_head", ...): backends that run
  // only some ops (the emulator) select cases by it.
  std::string op;
  std::string shape;
  // Runs the case on `ops` with tensors in `memory`; `ref` prepares inputs
  // that come from a forward pass. Returns the outputs to compare.
  std::function<std::vector<Output>(Ops& ops, DeviceMemory& memory, Ops& ref)> run;
};

// The table, built once.
const std::vector<OpCase>& OpCases();

// The op families of the table, in table order.
std::vector<std::string> OpFamilies();

}  // namespace tandem::kernels::testing
