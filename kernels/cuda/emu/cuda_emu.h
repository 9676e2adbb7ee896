// A small CPU emulator for CUDA kernels, test-only: runs the device code of
// kernels/cuda/*_kernel.cuh unchanged on the host so their indexing, tiling,
// masking and synchronisation are checked against the reference backend on
// machines without a GPU (CI).
//
// Model: one block at a time; each CUDA thread is a ucontext fiber with its
// own stack, scheduled cooperatively on the calling OS thread. __syncthreads
// is a block barrier and __shfl_xor_sync a warp barrier (exited threads
// count as arrived, as on Volta+). A pass with no runnable fiber aborts with
// "deadlock" (divergent barrier). Static __shared__ arrays become function
// statics (blocks never overlap); dynamic shared memory is a per-block buffer
// filled with NaN first, so reading unwritten shared memory shows up as NaN
// in the results. atomicAdd and atomicOr are plain updates (one OS thread). Not thread-safe;
// include before any kernel header.
#pragma once

#define TANDEM_CUDA_EMULATION 1

#include <math.h>
#include <ucontext.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace tandem_emu {

struct Fiber {
  ucontext_t ctx;
  std::unique_ptr<char[]> stack;
  int wait = 0;  // 0 runnable, 1 block barrier, 2 warp barrier
  uint64_t gen = 0;
  bool done = false;
  int parity = 0;
};

struct Block {
  int n = 0;
  std::vector<Fiber> fibers;
  ucontext_t sched;
  int current = 0;
  int active = 0;
  uint64_t block_gen = 0;
  int block_arrived = 0;
  std::vector<uint64_t> warp_gen;
  std::vector<int> warp_arrived, warp_active;
  std::vector<double> xchg[2];
  std::vector<float> smem;
  std::function<void()> kernel;
};

inline constexpr size_t kStackBytes = 256 * 1024;
inline Block* g_blk = nullptr;
inline dim3 g_thread, g_block, g_block_dim, g_grid_dim;

inline float* DynamicSmem() { return g_blk->smem.data(); }

inline void Yield() {
  Fiber& f = g_blk->fibers[g_blk->current];
  swapcontext(&f.ctx, &g_blk->sched);
}

inline void SyncThreads() {
  Block& b = *g_blk;
  Fiber& f = b.fibers[b.current];
  f.wait = 1;
  f.gen = b.block_gen;
  if (++b.block_arrived == b.active) {
    b.block_arrived = 0;
    ++b.block_gen;
  }
  Yield();
}

inline void SyncWarp() {
  Block& b = *g_blk;
  Fiber& f = b.fibers[b.current];
  const int w = b.current / 32;
  f.wait = 2;
  f.gen = b.warp_gen[w];
  if (++b.warp_arrived[w] == b.warp_active[w]) {
    b.warp_arrived[w] = 0;
    ++b.warp_gen[w];
  }
  Yield();
}

template <typename T>
T ShflXor(T v, int lane_mask) {
  Block& b = *g_blk;
  const int tid = b.current;
  Fiber& f = b.fibers[tid];
  const int par = f.parity;
  f.parity ^= 1;  // double buffer: one barrier per shuffle suffices
  b.xchg[par][tid] = static_cast<double>(v);
  SyncWarp();
  const int src = (tid / 32) * 32 + ((tid % 32) ^ lane_mask);
  return static_cast<T>(b.xchg[par][src]);
}

inline void Trampoline() {
  g_blk->kernel();
  g_blk->fibers[g_blk->current].done = true;
}

// Runs `kernel` (a callable invoking the __global__ function) over the grid.
inline void Launch(dim3 grid, dim3 block, size_t smem_bytes, std::function<void()> kernel) {
  Block b;
  b.n = static_cast<int>(block.x * block.y * block.z);
  b.fibers.resize(b.n);
  for (Fiber& f : b.fibers) f.stack.reset(new char[kStackBytes]);
  const int warps = (b.n + 31) / 32;
  b.xchg[0].assign(warps * 32, 0.0);
  b.xchg[1].assign(warps * 32, 0.0);
  b.kernel = std::move(kernel);
  g_blk = &b;
  g_grid_dim = grid;
  g_block_dim = block;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        g_block = dim3(bx, by, bz);
        b.smem.assign(smem_bytes / sizeof(float) + 1, std::numeric_limits<float>::quiet_NaN());
        b.active = b.n;
        b.block_gen = 0;
        b.block_arrived = 0;
        b.warp_gen.assign(warps, 0);
        b.warp_arrived.assign(warps, 0);
        b.warp_active.assign(warps, 0);
        for (int i = 0; i < b.n; ++i) b.warp_active[i / 32]++;
        for (int i = 0; i < b.n; ++i) {
          Fiber& f = b.fibers[i];
          f.wait = 0;
          f.done = false;
          f.parity = 0;
          getcontext(&f.ctx);
          f.ctx.uc_stack.ss_sp = f.stack.get();
          f.ctx.uc_stack.ss_size = kStackBytes;
          f.ctx.uc_link = &b.sched;
          makecontext(&f.ctx, Trampoline, 0);
        }
        for (;;) {
          bool progress = false, all_done = true;
          for (int i = 0; i < b.n; ++i) {
            Fiber& f = b.fibers[i];
            if (f.done) continue;
            all_done = false;
            const bool runnable =
                f.wait == 0 || (f.wait == 1 && b.block_gen > f.gen) || (f.wait == 2 && b.warp_gen[i / 32] > f.gen);
            if (!runnable) continue;
            f.wait = 0;
            b.current = i;
            g_thread = dim3(i % block.x, (i / block.x) % block.y, i / (block.x * block.y));
            swapcontext(&b.sched, &f.ctx);
            progress = true;
            if (f.done) {
              // An exited thread no longer holds back barriers.
              --b.active;
              const int w = i / 32;
              --b.warp_active[w];
              if (b.block_arrived > 0 && b.block_arrived == b.active) {
                b.block_arrived = 0;
                ++b.block_gen;
              }
              if (b.warp_arrived[w] > 0 && b.warp_arrived[w] == b.warp_active[w]) {
                b.warp_arrived[w] = 0;
                ++b.warp_gen[w];
              }
            }
          }
          if (all_done) break;
          if (!progress) {
            std::fprintf(stderr, "cuda_emu: deadlock in block (%u,%u,%u)\n", bx, by, bz);
            std::abort();
          }
        }
      }
  g_blk = nullptr;
}

}  // namespace tandem_emu

#define threadIdx (::tandem_emu::g_thread)
#define blockIdx (::tandem_emu::g_block)
#define blockDim (::tandem_emu::g_block_dim)
#define gridDim (::tandem_emu::g_grid_dim)

inline void __syncthreads() { tandem_emu::SyncThreads(); }
template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  return tandem_emu::ShflXor(v, lane_mask);
}
inline float atomicAdd(float* p, float v) {
  const float old = *p;
  *p += v;
  return old;
}
inline double atomicAdd(double* p, double v) {
  const double old = *p;
  *p += v;
  return old;
}
inline unsigned atomicOr(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p |= v;
  return old;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
