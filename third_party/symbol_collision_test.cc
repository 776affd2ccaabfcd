// Checks that no two shared objects loaded into a plait process define the same symbol.
// PyTorch's wheels bundle libraries inside libtorch_cpu.so (Gloo, protobuf, oneDNN, MKL, fmt,
// ...) and export some of their symbols; had plait also linked Debian's copy of one of them,
// the dynamic linker would bind every caller, LibTorch's own included, to whichever copy
// loaded first, and code compiled against one version would run the other's (Debian's libgloo
// 2022-05 beside the wheel's Gloo: gloo::rendezvous::Store has other virtuals in each).
// Run against every LibTorch CI builds with; linked with every system library plait uses.
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "torch/types.h"

namespace {

// The C++ functions and objects the ELF file at `path` defines strongly (STB_GLOBAL) in its
// dynamic symbol table. Weak definitions are left out: inline functions and template
// instantiations are rightly defined by many objects, and the first one wins by design. So
// are C symbols: Debian defines some on purpose in several libraries (OpenBLAS's BLAS in
// libblas.so.3 and libopenblas.so.0, glibc's compatibility versions), and the libraries a
// LibTorch bundles that plait also uses are C++ (Gloo, protobuf).
std::vector<std::string> StrongDefinitions(const std::string& path) {
  std::vector<std::string> names;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return names;
  struct stat info {};
  fstat(fd, &info);
  void* mapped = mmap(nullptr, info.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (mapped == MAP_FAILED) return names;
  const char* base = static_cast<const char*>(mapped);
  const auto* header = reinterpret_cast<const Elf64_Ehdr*>(base);
  const auto* sections = reinterpret_cast<const Elf64_Shdr*>(base + header->e_shoff);
  for (int i = 0; i < header->e_shnum; ++i) {
    if (sections[i].sh_type != SHT_DYNSYM) continue;
    const char* strings = base + sections[sections[i].sh_link].sh_offset;
    const auto* symbols = reinterpret_cast<const Elf64_Sym*>(base + sections[i].sh_offset);
    const size_t count = sections[i].sh_size / sizeof(Elf64_Sym);
    for (size_t s = 0; s < count; ++s) {
      const int type = ELF64_ST_TYPE(symbols[s].st_info);
      // SHN_ABS: version names such as GLIBC_2.2.5, which every glibc library defines.
      if (symbols[s].st_shndx != SHN_UNDEF && symbols[s].st_shndx != SHN_ABS &&
          ELF64_ST_BIND(symbols[s].st_info) == STB_GLOBAL &&
          (type == STT_FUNC || type == STT_OBJECT) &&
          std::strncmp(strings + symbols[s].st_name, "_Z", 2) == 0) {
        names.emplace_back(strings + symbols[s].st_name);
      }
    }
  }
  munmap(mapped, info.st_size);
  return names;
}

// The C++ runtime. PyTorch's manylinux wheels carry the parts of a newer libstdc++ they use
// (std::filesystem, the debug-mode iterators, ...) inside their own libraries, as the
// manylinux policy requires; those are the standard library's own definitions, under its
// stable ABI, not a second copy of a library plait builds against.
bool IsCxxRuntime(const std::string& path) {
  return path.find("/libstdc++.so") != std::string::npos;
}

int AddLoadedObject(dl_phdr_info* info, size_t /*size*/, void* paths) {
  // The main program has an empty name, the vDSO one that is not a file.
  if (info->dlpi_name != nullptr && info->dlpi_name[0] == '/') {
    static_cast<std::vector<std::string>*>(paths)->push_back(info->dlpi_name);
  }
  return 0;
}

// Every symbol defined strongly by two or more loaded shared objects, with their paths.
std::map<std::string, std::vector<std::string>> Collisions() {
  std::vector<std::string> paths;
  dl_iterate_phdr(AddLoadedObject, &paths);
  std::map<std::string, std::vector<std::string>> definers;
  for (const std::string& path : paths) {
    for (std::string& name : StrongDefinitions(path)) {
      std::vector<std::string>& where = definers[std::move(name)];
      // One library may define a name in several versions.
      if (where.empty() || where.back() != path) where.push_back(path);
    }
  }
  std::map<std::string, std::vector<std::string>> collisions;
  for (auto& [name, where] : definers) {
    if (where.size() > 1 && !std::any_of(where.begin(), where.end(), IsCxxRuntime)) {
      collisions.emplace(name, std::move(where));
    }
  }
  return collisions;
}

// The collisions grouped by the libraries involved, with a few symbols of each group.
std::string Describe(const std::map<std::string, std::vector<std::string>>& collisions) {
  std::map<std::string, std::vector<std::string>> by_libraries;
  for (const auto& [name, where] : collisions) {
    by_libraries[absl::StrJoin(where, " and ")].push_back(name);
  }
  std::string text = absl::StrCat(collisions.size(), " symbol(s) defined twice:");
  for (const auto& [libraries, names] : by_libraries) {
    absl::StrAppend(
        &text, "\n  ", names.size(), " in ", libraries, ", e.g. ",
        absl::StrJoin(names.begin(), names.begin() + std::min<size_t>(3, names.size()), ", "));
  }
  return text;
}

TEST(SymbolCollisionTest, NoTwoLoadedLibrariesDefineOneSymbol) {
  // Use each system library, so that none is left unloaded.
  EXPECT_EQ(torch::ones({2}).sum().item<float>(), 2.0f);
  EXPECT_NE(google::protobuf::DescriptorPool::generated_pool(), nullptr);
  EXPECT_GT(absl::Now(), absl::UnixEpoch());
  benchmark::DoNotOptimize(benchmark::GetBenchmarkFilter());

  const auto collisions = Collisions();
  EXPECT_TRUE(collisions.empty()) << Describe(collisions);
}

// The check itself: two libraries that define one symbol are caught.
TEST(SymbolCollisionTest, FindsASymbolTwoLibrariesDefine) {
  const std::string dir = absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/third_party/testdata/");
  void* first = dlopen((dir + "libcollision_probe_a.so").c_str(), RTLD_NOW | RTLD_LOCAL);
  void* second = dlopen((dir + "libcollision_probe_b.so").c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(first, nullptr) << dlerror();
  ASSERT_NE(second, nullptr) << dlerror();
  const auto collisions = Collisions();
  dlclose(second);
  dlclose(first);
  ASSERT_EQ(collisions.count("_Z19PlaitCollisionProbev"), 1u) << Describe(collisions);
  EXPECT_EQ(collisions.at("_Z19PlaitCollisionProbev").size(), 2u);
}

}  // namespace
