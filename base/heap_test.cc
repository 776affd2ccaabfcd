#include "base/heap.h"

#include <cstdlib>
#include <cstring>
#include <thread>

#include "gtest/gtest.h"

namespace plait::base {
namespace {

#if defined(__GLIBC__)
// A freed 64 MiB block comes back from the heap with its contents, instead of being unmapped
// and mapped afresh, zero-filled (which glibc does by default for blocks this large).
TEST(RetainFreedHeapMemoryTest, AFreedLargeBlockIsReused) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer replaces malloc, and quarantines what is freed";
#endif
  ASSERT_TRUE(RetainFreedHeapMemory());
  constexpr size_t kBytes = 64 << 20;
  char* first = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(first, nullptr);
  std::memset(first, 1, kBytes);
  std::free(first);
  char* second = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second, first);
  EXPECT_EQ(second[kBytes - 1], 1) << "the block was not reused but mapped afresh";
  std::free(second);
}

// The same across threads: a block freed by one thread comes back to another with its
// contents (glibc would give each thread an arena of its own, which maps a 64 MiB block for
// itself and unmaps it when freed).
TEST(RetainFreedHeapMemoryTest, ABlockFreedByOneThreadIsReusedByAnother) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer replaces malloc, and quarantines what is freed";
#endif
  ASSERT_TRUE(RetainFreedHeapMemory());
  constexpr size_t kBytes = 64 << 20;
  char* first = nullptr;
  std::thread([&] {
    first = static_cast<char*>(std::malloc(kBytes));
    ASSERT_NE(first, nullptr);
    std::memset(first, 1, kBytes);
    std::free(first);
  }).join();
  char* second = nullptr;
  std::thread([&] { second = static_cast<char*>(std::malloc(kBytes)); }).join();
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second, first);
  EXPECT_EQ(second[kBytes - 1], 1) << "the block was not reused but mapped afresh";
  std::free(second);
}
#endif

TEST(HeapBytesInUseTest, CountsALiveBlockAndNotAFreedOne) {
#if !defined(__GLIBC__) || defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "glibc's heap only";
#endif
  constexpr size_t kBytes = 64 << 20;
  const std::optional<int64_t> before = HeapBytesInUse();
  ASSERT_TRUE(before.has_value());
  char* block = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(block, nullptr);
  const int64_t held = *HeapBytesInUse();
  std::free(block);
  const int64_t after = *HeapBytesInUse();
  EXPECT_GE(held - *before, static_cast<int64_t>(kBytes));
  EXPECT_GE(held - after, static_cast<int64_t>(kBytes));
}

}  // namespace
}  // namespace plait::base
