// The kernel case table (op_cases.h) against every backend this machine
// runs without a GPU, each output compared with the reference backend:
//   cpu_2threads, cpu_1thread  the fast CPU backend (OpenBLAS + OpenMP)
//   cpu_guarded                the CPU backend behind the cpu-guarded device
//                              (device pointers the host cannot touch); its
//                              outputs also equal cpu_2threads' bit for bit
//   cuda_emu                   the CUDA kernels that cooperate within a block,
//                              on the CPU emulator (kernels/cuda/emu/)
// One test per (backend, op family). Bounds: op_check.h (1e-5 on the CPU
// backends; 1e-4 for reductions on the emulator, as on CUDA). Real CUDA runs
// the same table in kernels_gpu_test. Prints the largest error per output and
// the number of checks per backend at the end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/backends.h"
#include "kernels/cuda/emu/emu_ops.h"
#include "kernels/guarded/guarded_memory.h"
#include "kernels/tests/op_cases.h"
#include "kernels/tests/op_check.h"

namespace tandem::kernels::testing {
namespace {

const char* const kBackends[] = {"cpu_2threads", "cpu_1thread", "cpu_guarded", "cuda_emu"};

TestBackend MakeBackend(const std::string& name) {
  TestBackend b;
  b.name = name;
  b.bounds = kHostBounds;
  if (name == "cpu_guarded") {
    auto guarded = MakeGuardedMemory();
    b.ops = MakeGuardedOps(MakeCpuOps(2), guarded.get());
    b.memory = std::move(guarded);
    return b;
  }
  b.memory = MakeHostMemory();
  if (name == "cuda_emu") {
    b.ops = MakeEmuOps();
    b.bounds = kDeviceBounds;
    b.supports = EmuSupports;
  } else {
    b.ops = MakeCpuOps(name == "cpu_1thread" ? 1 : 2);
  }
  return b;
}

// Largest error per (backend, op output) and checks per backend, printed
// after all tests (the figures quoted in docs/kernels.md).
struct Tally {
  std::map<std::string, double> max_err;
  std::map<std::string, int> checks;
};
Tally& Seen() {
  static Tally t;
  return t;
}
class PrintTally : public ::testing::Environment {
 public:
  void TearDown() override {
    std::printf("max relative error vs reference:\n");
    for (const auto& [label, err] : Seen().max_err) std::printf("  %-44s %.2e\n", label.c_str(), err);
    for (const auto& [backend, n] : Seen().checks) std::printf("%s: %d checks\n", backend.c_str(), n);
  }
};
const auto* const kPrintTally = ::testing::AddGlobalTestEnvironment(new PrintTally);

using Param = std::tuple<std::string, std::string>;  // backend, op family

std::vector<Param> Params() {
  std::vector<Param> params;
  for (const char* name : kBackends) {
    const bool emu = std::string(name) == "cuda_emu";
    for (const std::string& op : OpFamilies())
      if (!emu || EmuSupports(op)) params.emplace_back(name, op);
  }
  return params;
}

class KernelOps : public ::testing::TestWithParam<Param> {};

TEST_P(KernelOps, MatchReference) {
  const auto& [backend_name, op] = GetParam();
  TestBackend backend = MakeBackend(backend_name);
  // cpu_guarded wraps the 2-thread CPU backend: outputs equal it bit for bit.
  std::unique_ptr<TestBackend> twin;
  if (backend_name == "cpu_guarded") twin = std::make_unique<TestBackend>(MakeBackend("cpu_2threads"));
  int checks = 0;
  for (size_t i = 0; i < OpCases().size(); ++i) {
    const OpCase& c = OpCases()[i];
    if (c.op != op) continue;
    std::string note;
    const std::vector<Output> got = RunOutputs(i, backend, &note);
    std::vector<Check> checks_of_case = CompareWithReference(i, got, backend.bounds, note);
    if (twin != nullptr) {  // the guarded device changes no bit
      std::string twin_note;
      const std::vector<Output> want = RunOutputs(i, *twin, &twin_note);
      for (Check& check : CompareBits(got, want)) checks_of_case.push_back(check);
    }
    for (const Check& check : checks_of_case) {
      ++checks;
      double& worst = Seen().max_err[backend_name + " " + op + "." + check.output];
      worst = std::max(worst, check.err);
      EXPECT_TRUE(check.pass) << backend_name << " " << op << " " << c.shape << " " << check.output << ": error "
                              << check.err << " > bound " << check.bound << " " << check.note;
    }
  }
  Seen().checks[backend_name] += checks;
  EXPECT_GT(checks, 0) << "no case of op family " << op;
}

INSTANTIATE_TEST_SUITE_P(Backends, KernelOps, ::testing::ValuesIn(Params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace tandem::kernels::testing
