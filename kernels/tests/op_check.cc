#include "kernels/tests/op_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>

#include "kernels/backends.h"

namespace tandem::kernels::testing {

double BoundOf(Bound b, const Bounds& bounds) {
  switch (b) {
    case Bound::kExact:
      return 0.0;
    case Bound::kElementwise:
      return bounds.elementwise;
    case Bound::kReduction:
      return bounds.reduction;
    case Bound::kUpdate:
      return bounds.update;
    case Bound::kDoubleSum:
      return bounds.double_sum;
  }
  return 0.0;
}

double ErrorOf(const Output& got, const Output& want, const Bounds& bounds) {
  if (want.bound == Bound::kDoubleSum) {
    const double diff = std::fabs(got.scalar - want.scalar);
    if (std::isnan(diff)) return INFINITY;
    return want.scalar == 0.0 ? diff : diff / std::fabs(want.scalar);
  }
  if (got.values.size() != want.values.size()) return INFINITY;
  const size_t n = want.values.size();
  if (want.bound == Bound::kExact) {
    size_t mismatches = 0;
    for (size_t i = 0; i < n; ++i) mismatches += std::memcmp(&got.values[i], &want.values[i], sizeof(float)) != 0;
    return static_cast<double>(mismatches);
  }
  double diff = 0, ref = 0;
  for (size_t i = 0; i < n; ++i) {
    const float g = got.values[i], r = want.values[i];
    if (!std::isfinite(r)) {  // e.g. lse = -inf: must match exactly
      if (g != r) return INFINITY;
      continue;
    }
    if (!std::isfinite(g)) return INFINITY;
    diff = std::max(diff, std::fabs(double(g) - double(r)));
    ref = std::max(ref, std::fabs(double(r)));
  }
  const double den = std::max({ref, bounds.floor, want.cancel_scale});
  return den > 0 ? diff / den : diff;
}

const std::vector<Output>& ReferenceOutputs(size_t case_index) {
  static std::mutex mu;
  static std::map<size_t, std::vector<Output>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(case_index);
  if (it == cache.end()) {
    auto ref = MakeReferenceOps();
    auto mem = MakeHostMemory();
    it = cache.emplace(case_index, OpCases()[case_index].run(*ref, *mem, *ref)).first;
  }
  return it->second;
}

std::vector<Output> RunOutputs(size_t case_index, TestBackend& backend, std::string* note) {
  auto ref = MakeReferenceOps();
  std::vector<Output> got = OpCases()[case_index].run(*backend.ops, *backend.memory, *ref);
  *note = backend.error ? backend.error() : "";
  if (note->empty() && !backend.memory->ok()) *note = backend.memory->last_error();
  return got;
}

std::vector<Check> CompareWithReference(size_t case_index, const std::vector<Output>& got, const Bounds& bounds,
                                        const std::string& note) {
  const std::vector<Output>& want = ReferenceOutputs(case_index);
  std::vector<Check> checks;
  for (size_t i = 0; i < want.size(); ++i) {
    Check c{want[i].name, INFINITY, BoundOf(want[i].bound, bounds), false, note};
    if (i < got.size() && got[i].name == want[i].name) c.err = ErrorOf(got[i], want[i], bounds);
    c.pass = note.empty() && c.err <= c.bound;
    checks.push_back(c);
  }
  return checks;
}

std::vector<Check> CompareBits(const std::vector<Output>& got, const std::vector<Output>& want) {
  std::vector<Check> checks;
  for (size_t i = 0; i < want.size(); ++i) {
    Check c{want[i].name + " bits", INFINITY, 0.0, false, ""};
    if (i < got.size() && got[i].name == want[i].name) {
      c.err = want[i].bound == Bound::kDoubleSum
                  ? double(std::memcmp(&got[i].scalar, &want[i].scalar, sizeof(double)) != 0)
                  : ErrorOf(Output{"", Bound::kExact, got[i].values}, Output{"", Bound::kExact, want[i].values}, {});
    }
    c.pass = c.err == 0.0;
    checks.push_back(c);
  }
  return checks;
}

std::vector<Check> RunCase(size_t case_index, TestBackend& backend) {
  std::string note;
  const std::vector<Output> got = RunOutputs(case_index, backend, &note);
  return CompareWithReference(case_index, got, backend.bounds, note);
}

}  // namespace tandem::kernels::testing
