// Attention memory does not grow with T^2: forward + backward of the fast CPU
// kernels at T = 1024 and T = 4096 (one sequence, causal), each measured in
// a fresh forked child (so the per-thread tile scratch is allocated inside
// the measurement, and OpenMP starts in the child). Two measures of the
// extra memory beyond the inputs/outputs (which the child allocates and
// touches first):
//  * heap: peak bytes through a counting operator new/delete replacement;
//  * process: peak RSS (VmHWM after a reset through /proc/self/clear_refs)
//    minus the RSS before the call (includes thread stacks and malloc).
// Both must grow far less than the 16x of a T x T buffer for 4x T.
// The parent process never starts OpenMP (fork after OpenMP is unsafe).
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/attention_cpu.h"

namespace {

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

void* Track(size_t n) {
  // 16-byte header keeps the size for delete.
  void* raw = std::malloc(n + 16);
  if (raw == nullptr) throw std::bad_alloc();
  *static_cast<size_t*>(raw) = n;
  const int64_t now = g_live.fetch_add(int64_t(n)) + int64_t(n);
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
  return static_cast<char*>(raw) + 16;
}

void Untrack(void* p) {
  if (p == nullptr) return;
  char* raw = static_cast<char*>(p) - 16;
  g_live.fetch_sub(int64_t(*reinterpret_cast<size_t*>(raw)));
  std::free(raw);
}

}  // namespace

void* operator new(size_t n) { return Track(n); }
void* operator new[](size_t n) { return Track(n); }
void operator delete(void* p) noexcept { Untrack(p); }
void operator delete[](void* p) noexcept { Untrack(p); }
void operator delete(void* p, size_t) noexcept { Untrack(p); }
void operator delete[](void* p, size_t) noexcept { Untrack(p); }

namespace tandem::kernels {
namespace {

long StatusKb(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(f, line)) {
    if (line.compare(0, n, field) == 0 && line[n] == ':') return std::atol(line.c_str() + n + 1);
  }
  return -1;
}

struct Extra {
  int64_t heap_bytes = -1;
  int64_t rss_kb = -1;
};

// Runs forward + backward in a forked child; returns its extra memory.
Extra MeasureInChild(int t, int h, int hkv, int d) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    AttentionParams p;
    p.num_heads = h;
    p.num_kv_heads = hkv;
    p.head_dim = d;
    const size_t nq = size_t(t) * h * d, nk = size_t(t) * hkv * d;
    std::vector<float> q(nq), k(nk), v(nk), dout(nq), out(nq), lse(size_t(t) * h), dq(nq), dk(nk), dv(nk);
    uint32_t s = 1;
    for (auto* x : {&q, &k, &v, &dout}) {
      for (float& e : *x) {
        s = s * 1664525u + 1013904223u;
        e = float(s >> 8) / float(1 << 24) - 0.5f;
      }
    }
    const int32_t cu[2] = {0, t};
    std::ofstream("/proc/self/clear_refs") << "5";
    const long rss0 = StatusKb("VmRSS");
    const int64_t live0 = g_live.load();
    g_peak.store(live0);
    cpu::attention_forward(p, q.data(), k.data(), v.data(), cu, 1, t, out.data(), lse.data());
    cpu::attention_backward(p, q.data(), k.data(), v.data(), out.data(), dout.data(), lse.data(), cu, 1, t, dq.data(),
                            dk.data(), dv.data());
    Extra e;
    e.heap_bytes = g_peak.load() - live0;
    e.rss_kb = StatusKb("VmHWM") - rss0;
    if (write(fds[1], &e, sizeof(e)) != sizeof(e)) _exit(2);
    _exit(0);
  }
  close(fds[1]);
  Extra e;
  if (read(fds[0], &e, sizeof(e)) != sizeof(e)) e = Extra{};
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return e;
}

void CheckGrowth(int h, int hkv) {
  const int d = 64;
  const Extra small = MeasureInChild(1024, h, hkv, d);
  const Extra large = MeasureInChild(4096, h, hkv, d);
  ASSERT_GE(small.heap_bytes, 0);
  ASSERT_GE(large.heap_bytes, 0);
  std::printf(
      "H=%d Hkv=%d D=%d: extra heap %lld B (T=1024) -> %lld B (T=4096); "
      "extra RSS %lld kB -> %lld kB\n",
      h, hkv, d, (long long)small.heap_bytes, (long long)large.heap_bytes, (long long)small.rss_kb,
      (long long)large.rss_kb);
  // Heap: only O(T) (Delta [T, H]) and per-thread tiles; growth well under 16x.
  EXPECT_LE(large.heap_bytes, 5 * small.heap_bytes + (64 << 10));
  // One T x T fp32 matrix at T = 4096 is 64 MiB; we must stay far below it.
  EXPECT_LT(large.heap_bytes, 4 << 20);
  // Process peak: same bound with 4 MiB slack for allocator/thread noise.
  EXPECT_LE(large.rss_kb, 5 * std::max<int64_t>(small.rss_kb, 0) + 4096);
  EXPECT_LT(large.rss_kb, 16 * 1024);
}

// With 2 threads, H=8 Hkv=8 takes the fused single-pass backward and H=4
// Hkv=1 the two-pass one (see attention_cpu.cc).
TEST(AttentionMemory, Heads8Kv8DoesNotGrowWithTSquared) { CheckGrowth(8, 8); }

TEST(AttentionMemory, Heads4Kv1DoesNotGrowWithTSquared) { CheckGrowth(4, 1); }

}  // namespace
}  // namespace tandem::kernels
