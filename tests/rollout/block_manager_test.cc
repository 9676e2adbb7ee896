// BlockManager: free list, reference counts, fork and copy-on-write.
#include "worker/rollout/block_manager.h"

#include <gtest/gtest.h>

namespace tandem::rollout {
namespace {

TEST(BlockManagerTest, AllocatesAndFreesBlocks) {
  BlockManager bm(4, 8);
  BlockTable t;
  std::vector<BlockCopy> copies;
  EXPECT_EQ(bm.BlocksNeeded(t, 0, 17), 3);
  ASSERT_TRUE(bm.Prepare(t, 0, 17, &copies));
  EXPECT_EQ(t.size(), 3u);
  EXPECT_EQ(bm.free_blocks(), 1);
  // Positions 17..23 are in block 2: nothing new.
  ASSERT_TRUE(bm.Prepare(t, 17, 24, &copies));
  EXPECT_EQ(t.size(), 3u);
  // Two more blocks do not fit: nothing changes.
  EXPECT_FALSE(bm.Prepare(t, 24, 40, &copies));
  EXPECT_EQ(t.size(), 3u);
  EXPECT_EQ(bm.free_blocks(), 1);
  EXPECT_TRUE(copies.empty());
  bm.Free(t);
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(bm.free_blocks(), 4);
  EXPECT_EQ(bm.peak_used_blocks(), 3);
}

TEST(BlockManagerTest, ForkSharesAndCopiesOnWrite) {
  BlockManager bm(6, 4);
  BlockTable a;
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(bm.Prepare(a, 0, 6, &copies));  // a prompt of 6: block 1 half full
  BlockTable b = bm.Fork(a, 2);
  EXPECT_EQ(b, a);
  EXPECT_EQ(bm.ref_count(a[0]), 2);
  EXPECT_EQ(bm.ref_count(a[1]), 2);
  EXPECT_EQ(bm.free_blocks(), 4);
  // b writes position 6: its shared last block is copied first.
  EXPECT_EQ(bm.BlocksNeeded(b, 6, 7), 1);
  ASSERT_TRUE(bm.Prepare(b, 6, 7, &copies));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, a[1]);
  EXPECT_EQ(copies[0].dst, b[1]);
  EXPECT_NE(a[1], b[1]);
  EXPECT_EQ(b[0], a[0]);
  EXPECT_EQ(bm.ref_count(a[1]), 1);
  // a now owns its last block alone: it writes in place.
  copies.clear();
  ASSERT_TRUE(bm.Prepare(a, 6, 7, &copies));
  EXPECT_TRUE(copies.empty());
  bm.Free(a);
  EXPECT_EQ(bm.ref_count(b[0]), 1);
  bm.Free(b);
  EXPECT_EQ(bm.free_blocks(), 6);
}

TEST(BlockManagerTest, CopyOnWriteNeedsAFreeBlock) {
  BlockManager bm(2, 4);
  BlockTable a;
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(bm.Prepare(a, 0, 6, &copies));
  BlockTable b = bm.Fork(a, 2);
  EXPECT_EQ(bm.free_blocks(), 0);
  EXPECT_FALSE(bm.Prepare(b, 6, 7, &copies));
  EXPECT_EQ(b, a);
  bm.Free(a);
  ASSERT_TRUE(bm.Prepare(b, 6, 7, &copies));  // sole owner now: in place
  EXPECT_TRUE(copies.empty());
  bm.Free(b);
  EXPECT_EQ(bm.free_blocks(), 2);
}

}  // namespace
}  // namespace tandem::rollout
