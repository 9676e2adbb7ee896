// Attention benchmark (FlashAttention-2 style CPU kernels).
//
//   build-*/kernels_bench_attention [--threads 2] [--reps 3] [--lengths 1024,4096]
//
// Causal forward + backward, B=4 sequences packed (cu_seqlens), H=8, Hkv=8,
// D=64; then decode (config A shape: batch 16, H=8, Hkv=2, D=64, cache 256,
// one new token). FLOP convention: forward 4*T^2*D*H*B/2 (the causal half of
// QK^T and PV), backward 2.5x the forward (5 matmuls of the same size).
// Extra memory: peak RSS (VmHWM, reset through /proc/self/clear_refs) minus
// RSS with every input and output already allocated and touched.
// Prints a Markdown table; times are the minimum over --reps runs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backends.h"
#include "kernels/cpu/attention_cpu.h"

namespace {

using Clock = std::chrono::steady_clock;

long StatusKb(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(f, line)) {
    if (line.compare(0, n, field) == 0 && line[n] == ':') {
      return std::atol(line.c_str() + n + 1);
    }
  }
  return 0;
}

void ResetPeakRss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
}

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// CPU seconds used by the whole process (all threads): under a loaded
// machine, flops / cpu-seconds * threads still shows the kernel's speed.
double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 3;
  std::vector<int> lengths = {1024, 4096};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") {
      threads = std::atoi(argv[i + 1]);
    } else if (a == "--reps") {
      reps = std::atoi(argv[i + 1]);
    } else if (a == "--lengths") {
      lengths.clear();
      std::stringstream ss(argv[i + 1]);
      std::string tok;
      while (std::getline(ss, tok, ',')) lengths.push_back(std::atoi(tok.c_str()));
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  tandem::kernels::SetCpuThreads(threads);
  const int B = 4, H = 8, Hkv = 8, D = 64;
  tandem::kernels::AttentionParams p;
  p.num_heads = H;
  p.num_kv_heads = Hkv;
  p.head_dim = D;
  p.causal = true;
  std::printf("# tandem cpu attention, %d threads, B=%d H=%d Hkv=%d D=%d, causal, fp32\n", threads, B, H, Hkv, D);
  std::printf(
      "| T | fwd ms | bwd ms | fwd+bwd ms | fwd GFLOP/s | bwd GFLOP/s | "
      "fwd+bwd GFLOP/s | GFLOP per CPU-s | extra MB |\n"
      "|---|---|---|---|---|---|---|---|---|\n");
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int T : lengths) {
    const size_t tot = size_t(B) * T;
    std::vector<int32_t> cu(B + 1);
    for (int b = 0; b <= B; ++b) cu[b] = b * T;
    std::vector<float> q(tot * H * D), k(tot * Hkv * D), v(k.size()), dout(q.size());
    for (auto* x : {&q, &k, &v, &dout})
      for (float& e : *x) e = nd(rng);
    std::vector<float> out(q.size(), 0.f), lse(tot * H, 0.f), dq(q.size(), 0.f), dk(k.size(), 0.f), dv(k.size(), 0.f);
    // Warm-up (grows the per-thread tile scratch once, as in steady state).
    tandem::kernels::cpu::attention_forward(p, q.data(), k.data(), v.data(), cu.data(), B, int(tot), out.data(),
                                            lse.data());
    const long base_kb = StatusKb("VmRSS");
    ResetPeakRss();
    double fwd = 1e30, bwd = 1e30;
    const double cpu0 = ProcessCpuSeconds();
    for (int r = 0; r < reps; ++r) {
      const auto t0 = Clock::now();
      tandem::kernels::cpu::attention_forward(p, q.data(), k.data(), v.data(), cu.data(), B, int(tot), out.data(),
                                              lse.data());
      const auto t1 = Clock::now();
      tandem::kernels::cpu::attention_backward(p, q.data(), k.data(), v.data(), out.data(), dout.data(), lse.data(),
                                               cu.data(), B, int(tot), dq.data(), dk.data(), dv.data());
      const auto t2 = Clock::now();
      fwd = std::min(fwd, Seconds(t0, t1));
      bwd = std::min(bwd, Seconds(t1, t2));
    }
    const double cpu_s = (ProcessCpuSeconds() - cpu0) / reps;
    const double extra_mb = (StatusKb("VmHWM") - base_kb) / 1024.0;
    const double ffl = 4.0 * T * double(T) * D * H * B / 2;
    const double bfl = 2.5 * ffl;
    std::printf("| %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", T, fwd * 1e3, bwd * 1e3,
                (fwd + bwd) * 1e3, ffl / fwd / 1e9, bfl / bwd / 1e9, (ffl + bfl) / (fwd + bwd) / 1e9,
                (ffl + bfl) / cpu_s / 1e9, extra_mb);
    std::fflush(stdout);
  }

  // Decode: config A attention shape, batch 16, cache of 256 (prompt 128 +
  // 128 new), one new token per sequence.
  {
    const int batch = 16, Hd = 8, Hkvd = 2, cap = 256, len = 256;
    tandem::kernels::AttentionParams pd;
    pd.num_heads = Hd;
    pd.num_kv_heads = Hkvd;
    pd.head_dim = D;
    std::vector<float> kc(size_t(batch) * cap * Hkvd * D), vc(kc.size()), qd(size_t(batch) * Hd * D), od(qd.size());
    for (auto* x : {&kc, &vc, &qd})
      for (float& e : *x) e = nd(rng);
    std::vector<int32_t> cl(batch, len);
    const int iters = 2000;
    tandem::kernels::cpu::decode_attention(pd, qd.data(), batch, 1, kc.data(), vc.data(), cap, cl.data(), od.data());
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      tandem::kernels::cpu::decode_attention(pd, qd.data(), batch, 1, kc.data(), vc.data(), cap, cl.data(), od.data());
    }
    const double s = Seconds(t0, Clock::now()) / iters;
    const double bytes = 2.0 * batch * len * Hkvd * D * sizeof(float);
    std::printf(
        "\ndecode: batch %d, H=%d Hkv=%d D=%d, cache %d, 1 new token: %.1f us "
        "per call, %.1f GB/s of K/V read\n",
        batch, Hd, Hkvd, D, len, s * 1e6, bytes / s / 1e9);
  }
  return 0;
}
