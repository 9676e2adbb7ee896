// MakeHostMemory: the CPU backends' allocator. Sizes that would wrap in the
// alignment rounding fail with a message instead of returning a short
// buffer; large buffers (huge-page aligned) are whole and writable.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include "kernels/backends.h"
#include "kernels/memory.h"

namespace tandem::kernels {
namespace {

TEST(HostMemoryTest, SmallAndLargeBuffersAreWholeAndCounted) {
  auto mem = MakeHostMemory();
  for (size_t bytes : {size_t{1}, size_t{4096}, (size_t{4} << 20) - 1, size_t{4} << 20, (size_t{9} << 20) + 3}) {
    auto* p = static_cast<unsigned char*>(mem->Allocate(bytes));
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u) << bytes;
    std::memset(p, 0x5a, bytes);
    EXPECT_EQ(p[0], 0x5a);
    EXPECT_EQ(p[bytes - 1], 0x5a);
    EXPECT_EQ(mem->allocated_bytes(), bytes);
    mem->Free(p);
    EXPECT_EQ(mem->allocated_bytes(), 0u);
  }
}

TEST(HostMemoryTest, SizesThatWouldWrapFailWithAMessage) {
  auto mem = MakeHostMemory();
  for (size_t bytes : {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - 255, SIZE_MAX - (size_t{2} << 20)}) {
    EXPECT_EQ(mem->Allocate(bytes), nullptr) << bytes;
    EXPECT_NE(mem->last_error().find("out of memory allocating"), std::string::npos) << mem->last_error();
    EXPECT_EQ(mem->allocated_bytes(), 0u);
  }
}

}  // namespace
}  // namespace tandem::kernels
