// kernels_gpu_test: the kernel case table (kernels/tests/op_cases.h) against
// CudaOps, every output compared with the reference backend (plain loops,
// double accumulators) with the bounds of kernels/tests/op_check.h for
// device backends: max_i |cuda_i - ref_i| / max(max_i |ref_i|, 1e-2) within
// 1e-5 for elementwise ops, 1e-4 for reductions, bit for bit for copies,
// conversions and token ids, 1e-9 relative for sum_squares. Then device
// memory, error reporting and a few throughput figures.
//
// No GoogleTest on purpose: the binary builds on a bare CUDA machine. With no
// CUDA device it prints "kernels_gpu_test: no CUDA device: skipped" and exits
// 0. Otherwise it prints one table row per check (op and output, shape,
// error, bound, PASS/FAIL, ms of the case including copies) and exits 1 if
// any check failed. `kernels_gpu_test FILTER` runs only the op families
// (and the memory, errors, bench parts) whose name contains FILTER.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backends.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/memory.h"
#include "kernels/ops.h"
#include "kernels/tests/op_cases.h"
#include "kernels/tests/op_check.h"

namespace tandem::kernels {
namespace {

struct Row {
  std::string op;
  std::string shape;
  double err;
  double tol;
  bool pass;
  double ms;
  std::string note;
};

std::vector<Row> g_rows;
const char* g_filter = nullptr;

bool Selected(const char* op) { return g_filter == nullptr || std::strstr(op, g_filter) != nullptr; }

// RAII device array.
template <typename T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) {
    if (cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) {
      p_ = nullptr;
    }
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { Upload(h); }
  ~Dev() {
    if (p_ != nullptr) cudaFree(p_);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* get() const { return p_; }
  void Upload(const std::vector<T>& h) {
    if (p_ != nullptr && !h.empty()) {
      cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
    }
  }
  std::vector<T> Download() const {
    std::vector<T> h(n_);
    if (p_ != nullptr && n_ > 0) {
      cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    }
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

class GpuTimer {
 public:
  GpuTimer() {
    cudaEventCreate(&a_);
    cudaEventCreate(&b_);
  }
  ~GpuTimer() {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  void Start() { cudaEventRecord(a_, 0); }
  double StopMs() {
    cudaEventRecord(b_, 0);
    cudaEventSynchronize(b_);
    float ms = 0.f;
    cudaEventElapsedTime(&ms, a_, b_);
    return ms;
  }

 private:
  cudaEvent_t a_, b_;
};

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  std::vector<float> Uniform(size_t n, float lo = -1.f, float hi = 1.f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(gen_);
    return v;
  }
  std::vector<int32_t> Ints(size_t n, int lo, int hi_inclusive) {
    std::uniform_int_distribution<int> dist(lo, hi_inclusive);
    std::vector<int32_t> v(n);
    for (auto& x : v) x = dist(gen_);
    return v;
  }

 private:
  std::mt19937_64 gen_;
};

// Records one comparison; a CUDA error recorded by the backend fails it.
void Report(CudaOps& cuda, const std::string& op, const std::string& shape, double err, double tol, double ms) {
  cuda.Synchronize();
  Row row{op, shape, err, tol, err <= tol && cuda.ok(), ms, ""};
  if (!cuda.ok()) {
    row.note = cuda.last_error();
    cuda.ClearError();
  }
  std::printf("%-26s %-44s %10.3e %8.0e %-4s %9.3f %s\n", row.op.c_str(), row.shape.c_str(), row.err, row.tol,
              row.pass ? "PASS" : "FAIL", row.ms, row.note.c_str());
  std::fflush(stdout);
  g_rows.push_back(row);
}

std::string Fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string Fmt(const char* f, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof(buf), f, ap);
  va_end(ap);
  return buf;
}

// The kernel case table (kernels/tests/op_cases.h) against CudaOps, every
// output compared with the reference backend; one row per output.
void RunTable(std::unique_ptr<CudaOps> cuda_ops) {
  CudaOps* cuda = cuda_ops.get();
  testing::TestBackend backend;
  backend.name = "cuda";
  backend.memory = MakeCudaMemory();
  backend.ops = std::move(cuda_ops);
  backend.bounds = testing::kDeviceBounds;
  backend.error = [cuda] {
    cuda->Synchronize();
    if (cuda->ok()) return std::string();
    std::string e = cuda->last_error();
    cuda->ClearError();
    return e;
  };
  if (backend.memory == nullptr) {
    g_rows.push_back({"table", "MakeCudaMemory returned nullptr", 1, 0, false, 0, ""});
    return;
  }
  const auto& cases = testing::OpCases();
  for (size_t i = 0; i < cases.size(); ++i) {
    if (!Selected(cases[i].op.c_str())) continue;
    if (cases[i].op == "sparse_decode") continue;  // CPU backends only
    testing::ReferenceOutputs(i);                  // outside the timed region
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<testing::Check> checks = testing::RunCase(i, backend);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    for (const testing::Check& c : checks) {
      Row row{cases[i].op + " " + c.output, cases[i].shape, c.err, c.bound, c.pass, ms, c.note};
      std::printf("%-30s %-44s %10.3e %8.0e %-4s %9.3f %s\n", row.op.c_str(), row.shape.c_str(), row.err, row.tol,
                  row.pass ? "PASS" : "FAIL", row.ms, row.note.c_str());
      std::fflush(stdout);
      g_rows.push_back(row);
    }
  }
}

// ------------------------------------------------------------ memory --
// MakeCudaMemory: upload, device copy, zero, an op in between (same legacy
// stream), download from another thread, all bitwise; allocated_bytes; an
// impossible allocation returns nullptr with a recorded error.
void TestMemory(CudaOps& cuda) {
  if (!Selected("memory")) return;
  GpuTimer timer;
  Rng rng(11);
  const size_t n = (size_t(1) << 20) + 7;
  const std::vector<float> host = rng.Uniform(n);
  std::unique_ptr<DeviceMemory> mem = MakeCudaMemory();
  if (mem == nullptr) {
    Report(cuda, "memory", "MakeCudaMemory returned nullptr", 1, 0, 0);
    return;
  }
  timer.Start();
  DeviceArray<float> a, b;
  bool bad = !a.Allocate(mem.get(), n) || !b.AllocateZeroed(mem.get(), n);
  bad = bad || mem->allocated_bytes() != 2 * n * sizeof(float);
  if (!bad) {
    a.Upload(host.data(), n);
    mem->CopyOnDevice(b.data() + 3, a.data(), (n - 3) * sizeof(float));
    cuda.scale(b.data(), 2.f, n);  // ordered after the copy (legacy stream)
    mem->SetZero(a.data() + n / 2, (n - n / 2) * sizeof(float));
    std::vector<float> ga(n), gb(n);
    std::thread reader([&] {  // a new thread: the memory selects the device
      a.Download(ga.data(), n);
      b.Download(gb.data(), n);
    });
    reader.join();
    for (size_t i = 0; i < n && !bad; ++i) {
      const float ea = i < n / 2 ? host[i] : 0.f;
      const float eb = i < 3 ? 0.f : host[i - 3] * 2.f;
      bad = std::memcmp(&ga[i], &ea, 4) != 0 || std::memcmp(&gb[i], &eb, 4) != 0;
    }
    bad = bad || !mem->Synchronize() || !mem->ok();
  }
  const double ms = timer.StopMs();
  a.reset();
  b.reset();
  bad = bad || mem->allocated_bytes() != 0;
  Report(cuda, "memory round trip",
         Fmt("n%zu copy/zero/op/thread (bitwise) %s", n, mem->ok() ? "" : mem->last_error().c_str()), double(bad), 0,
         ms);

  std::unique_ptr<DeviceMemory> oom = MakeCudaMemory();
  void* huge = oom->Allocate(size_t(1) << 50);
  const bool caught = huge == nullptr && !oom->ok() && oom->last_error().find("out of memory") != std::string::npos;
  if (huge != nullptr) oom->Free(huge);
  Report(cuda, "memory oom", "1 PiB -> nullptr + error", caught ? 0.0 : 1.0, 0, 0);
}

// Unsupported shapes must become a recorded error, not a crash.
void TestErrors(CudaOps& cuda) {
  if (!Selected("errors")) return;
  AttentionParams p;
  p.num_heads = 3;
  p.num_kv_heads = 2;  // does not divide
  cuda.attention_forward(p, nullptr, nullptr, nullptr, nullptr, 1, 4, nullptr, nullptr);
  const bool caught = !cuda.ok();
  const std::string msg = cuda.last_error();
  cuda.ClearError();
  Row row{"errors", "attention H3 Hkv2", caught ? 0.0 : 1.0, 0, caught, 0, msg};
  std::printf("%-26s %-44s %10.3e %8.0e %-4s %9.3f %s\n", row.op.c_str(), row.shape.c_str(), row.err, row.tol,
              row.pass ? "PASS" : "FAIL", 0.0, msg.c_str());
  g_rows.push_back(row);
}

// ---------------------------------------------------------- throughput --
// Not compared with the reference (too slow there): device time only.
void Bench(CudaOps& cuda) {
  if (!Selected("bench")) return;
  std::printf("\n%-40s %10s %12s\n", "benchmark", "ms", "GFLOP/s");
  GpuTimer timer;
  Rng rng(10);
  {
    const int n = 4096;
    Dev<float> a(rng.Uniform(size_t(n) * n)), b(rng.Uniform(size_t(n) * n)), c(size_t(n) * n);
    cuda.matmul(false, false, n, n, n, 1.f, a.get(), n, b.get(), n, 0.f, c.get(), n);
    timer.Start();
    for (int i = 0; i < 5; ++i) cuda.matmul(false, false, n, n, n, 1.f, a.get(), n, b.get(), n, 0.f, c.get(), n);
    const double ms = timer.StopMs() / 5;
    std::printf("%-40s %10.3f %12.1f\n", "sgemm 4096^3 (fp32, no TF32)", ms, 2.0 * n * n * n / (ms * 1e6));
  }
  for (int seqlen : {1024, 4096}) {
    const int batch = 4, h = 8, d = 64;
    std::vector<int32_t> cu{0};
    for (int i = 0; i < batch; ++i) cu.push_back(cu.back() + seqlen);
    const int t = cu.back();
    const size_t nq = size_t(t) * h * d;
    Dev<float> q(rng.Uniform(nq)), k(rng.Uniform(nq)), v(rng.Uniform(nq)), out(nq), lse(size_t(t) * h),
        g(rng.Uniform(nq)), dq(nq), dk(nq), dv(nq);
    Dev<int32_t> dcu(cu);
    AttentionParams p;
    p.num_heads = h;
    p.num_kv_heads = h;
    p.head_dim = d;
    cuda.attention_forward(p, q.get(), k.get(), v.get(), dcu.get(), batch, t, out.get(), lse.get());
    timer.Start();
    cuda.attention_forward(p, q.get(), k.get(), v.get(), dcu.get(), batch, t, out.get(), lse.get());
    const double fwd_ms = timer.StopMs();
    cuda.attention_backward(p, q.get(), k.get(), v.get(), out.get(), g.get(), lse.get(), dcu.get(), batch, t, dq.get(),
                            dk.get(), dv.get());
    timer.Start();
    cuda.attention_backward(p, q.get(), k.get(), v.get(), out.get(), g.get(), lse.get(), dcu.get(), batch, t, dq.get(),
                            dk.get(), dv.get());
    const double bwd_ms = timer.StopMs();
    // Causal: half of the 4 B H T^2 D multiply-adds forward, 2.5x backward.
    const double fwd_flop = 2.0 * batch * h * double(seqlen) * seqlen * d;
    std::printf("%-40s %10.3f %12.1f\n", Fmt("attention fwd B4 H8 D64 T%d causal", seqlen).c_str(), fwd_ms,
                fwd_flop / (fwd_ms * 1e6));
    std::printf("%-40s %10.3f %12.1f\n", Fmt("attention bwd B4 H8 D64 T%d causal", seqlen).c_str(), bwd_ms,
                2.5 * fwd_flop / (bwd_ms * 1e6));
  }
  {
    const int batch = 16, h = 8, hkv = 2, d = 64, cap = 4096;
    std::vector<int32_t> lens(batch, cap);
    Dev<float> q(rng.Uniform(size_t(batch) * h * d)), kc(rng.Uniform(size_t(batch) * cap * hkv * d)),
        vc(rng.Uniform(size_t(batch) * cap * hkv * d)), out(size_t(batch) * h * d);
    Dev<int32_t> dl(lens);
    AttentionParams p;
    p.num_heads = h;
    p.num_kv_heads = hkv;
    p.head_dim = d;
    cuda.decode_attention(p, q.get(), batch, 1, kc.get(), vc.get(), cap, dl.get(), out.get());
    timer.Start();
    cuda.decode_attention(p, q.get(), batch, 1, kc.get(), vc.get(), cap, dl.get(), out.get());
    const double ms = timer.StopMs();
    // Bytes read per query head (K and V rows re-read per head of a group).
    const double bytes = 2.0 * batch * h * double(cap) * d * sizeof(float);
    std::printf("%-40s %10.3f %9.1f GB/s\n", "decode B16 H8 Hkv2 D64 cache4096", ms, bytes / (ms * 1e6));
  }
  cuda.Synchronize();
  if (!cuda.ok()) std::printf("bench error: %s\n", cuda.last_error().c_str());
}

}  // namespace
}  // namespace tandem::kernels

int main(int argc, char** argv) {
  using namespace tandem::kernels;
  if (argc > 1) g_filter = argv[1];
  if (!CudaDeviceAvailable()) {
    std::printf(
        "kernels_gpu_test: no CUDA device: skipped (built OK; nothing "
        "was run)\n");
    return 0;
  }
  std::unique_ptr<CudaOps> cuda = CudaOps::Create();
  if (cuda == nullptr) {
    std::printf(
        "kernels_gpu_test: CUDA device present but CudaOps::Create "
        "failed\n");
    return 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("kernels_gpu_test on %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount);
  std::printf("%-26s %-44s %10s %8s %-4s %9s\n", "op", "shape", "rel_err", "bound", "ok", "ms");
  std::unique_ptr<CudaOps> checked = CudaOps::Create();
  if (checked == nullptr) {
    std::printf("kernels_gpu_test: a second CudaOps::Create failed\n");
    return 1;
  }
  RunTable(std::move(checked));
  TestErrors(*cuda);
  TestMemory(*cuda);
  int failed = 0;
  for (const Row& r : g_rows) failed += r.pass ? 0 : 1;
  Bench(*cuda);
  std::printf("\nkernels_gpu_test: %zu checks, %d failed\n", g_rows.size(), failed);
  return failed == 0 ? 0 : 1;
}
