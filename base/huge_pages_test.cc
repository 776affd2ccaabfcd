// UseHugePagesForHeap re-executes the test binary, so this test has its own main(), which
// calls it first, as a training job's main() does.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/heap.h"
#include "gtest/gtest.h"

namespace plait::base {
namespace {

bool g_heap_uses_huge_pages = false;
std::vector<std::string> g_arguments;

bool KernelHandsOutHugePagesOnRequest() {
  std::ifstream setting("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string text;
  std::getline(setting, text);
  return text.find("[madvise]") != std::string::npos;
}

// The VmFlags line of the mapping that holds `address`, from /proc/self/smaps.
std::string VmFlagsOfMappingHolding(const void* address) {
  const auto target = reinterpret_cast<uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t start = 0;
    uintptr_t end = 0;
    char dash = 0;
    std::istringstream header(line);
    // A mapping's header line starts "start-end " in hex; its field lines start with a name.
    if (header >> std::hex >> start >> dash >> end && dash == '-') {
      inside = start <= target && target < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

class UseHugePagesForHeapTest : public testing::Test {
 protected:
  void SetUp() override {
#if !defined(__GLIBC__) || defined(__SANITIZE_ADDRESS__)
    GTEST_SKIP() << "the heap is not glibc's";
#endif
    if (!KernelHandsOutHugePagesOnRequest()) {
      GTEST_SKIP() << "the kernel's transparent huge pages are not in madvise mode";
    }
  }
};

TEST_F(UseHugePagesForHeapTest, ReExecutedWithTheTunableAndTheSameArguments) {
  EXPECT_TRUE(g_heap_uses_huge_pages);
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  ASSERT_NE(tunables, nullptr);
  EXPECT_NE(std::string(tunables).find("glibc.malloc.hugetlb=1"), std::string::npos) << tunables;
  // The BUILD rule passes these two; they survive the re-execution in order.
  ASSERT_GE(g_arguments.size(), 3u);
  EXPECT_EQ(g_arguments[g_arguments.size() - 2], "--first=kept");
  EXPECT_EQ(g_arguments.back(), "second kept");
}

TEST_F(UseHugePagesForHeapTest, LargeBlocksAreInMappingsAdvisedForHugePages) {
  constexpr size_t kBytes = 8 << 20;
  char* block = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, kBytes);
  const std::string flags = VmFlagsOfMappingHolding(block + kBytes / 2);
  std::free(block);
  // "hg": the mapping was advised MADV_HUGEPAGE.
  EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
}

TEST_F(UseHugePagesForHeapTest, ASecondCallKeepsTheSettingWithoutReExecuting) {
  EXPECT_TRUE(UseHugePagesForHeap(nullptr));
}

TEST_F(UseHugePagesForHeapTest, TheTunableSetToZeroIsKeptAndTurnsItOff) {
  ASSERT_NE(std::getenv("GLIBC_TUNABLES"), nullptr);
  const std::string saved = std::getenv("GLIBC_TUNABLES");
  setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0", 1);
  EXPECT_FALSE(UseHugePagesForHeap(nullptr));
  EXPECT_STREQ(std::getenv("GLIBC_TUNABLES"), "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0");
  setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0:glibc.malloc.arena_max=2", 1);
  EXPECT_FALSE(UseHugePagesForHeap(nullptr));
  setenv("GLIBC_TUNABLES", saved.c_str(), 1);
}

}  // namespace
}  // namespace plait::base

int main(int argc, char** argv) {
  plait::base::g_heap_uses_huge_pages = plait::base::UseHugePagesForHeap(argv);
  plait::base::g_arguments.assign(argv, argv + argc);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
