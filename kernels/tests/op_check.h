// Runs the kernel case table (op_cases.h) against one backend and compares
// every output with the reference backend's.
//
// Error of an output: max_i |got_i - ref_i| / max(max_i |ref_i|, floor,
// cancel_scale) (absolute when all three are 0); non-finite
// reference values must be matched exactly, a non-finite result elsewhere is
// an infinite error. kExact outputs count bitwise mismatches (bound 0);
// kDoubleSum is |got - ref| / |ref|. A backend states its bound per class.
// No GoogleTest: the GPU binary uses it too.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/memory.h"
#include "kernels/ops.h"
#include "kernels/tests/op_cases.h"

namespace tandem::kernels::testing {

struct Bounds {
  double elementwise;
  double reduction;
  double update;
  double double_sum;
  double floor;  // outputs smaller than this in magnitude compare absolutely
};

// The CPU backends sum in nearly the reference's order.
inline constexpr Bounds kHostBounds{1e-5, 1e-5, 1e-4, 1e-12, 0.0};
// CUDA (and its emulator): tiles, warp shuffles and atomics reorder sums.
inline constexpr Bounds kDeviceBounds{1e-5, 1e-4, 1e-4, 1e-9, 1e-2};

// A backend under test. `supports` selects the op families it runs (empty:
// all); `error` returns and clears an error the backend recorded ("" if none).
struct TestBackend {
  std::string name;
  std::unique_ptr<DeviceMemory> memory;
  std::unique_ptr<Ops> ops;
  Bounds bounds;
  std::function<bool(const std::string& op)> supports;
  std::function<std::string()> error;
};

struct Check {
  std::string output;
  double err;
  double bound;
  bool pass;
  std::string note;  // a recorded backend error
};

double BoundOf(Bound b, const Bounds& bounds);
double ErrorOf(const Output& got, const Output& want, const Bounds& bounds);

// The reference outputs of case i, computed once per process.
const std::vector<Output>& ReferenceOutputs(size_t case_index);

// Runs case i on `backend`; `note` gets an error the backend recorded.
std::vector<Output> RunOutputs(size_t case_index, TestBackend& backend, std::string* note);

// Compares outputs with the reference's under the backend's bounds.
std::vector<Check> CompareWithReference(size_t case_index, const std::vector<Output>& got, const Bounds& bounds,
                                        const std::string& note);

// Compares outputs bit for bit with another backend's (one check each).
std::vector<Check> CompareBits(const std::vector<Output>& got, const std::vector<Output>& want);

// RunOutputs, then CompareWithReference.
std::vector<Check> RunCase(size_t case_index, TestBackend& backend);

}  // namespace tandem::kernels::testing
