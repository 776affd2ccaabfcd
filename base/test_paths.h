// Paths in a test's temporary folder (Bazel's TEST_TMPDIR), for tests that write files:
//
//   const std::string path = TestPath("round_trip.safetensors");
//   const std::string dir = FreshTestDir("checkpoints");  // empty, whatever ran before
//   EXPECT_THAT(FolderEntries(dir), ElementsAre(".lock", "step-00000003"));
#ifndef PLAIT_BASE_TEST_PATHS_H_
#define PLAIT_BASE_TEST_PATHS_H_

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace plait::base::testing {

// `name` in the test's temporary folder.
inline std::string TestPath(absl::string_view name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

// TestPath(name), with whatever an earlier part of the test left there removed.
inline std::string FreshTestDir(absl::string_view name) {
  const std::string dir = TestPath(name);
  std::filesystem::remove_all(dir);
  return dir;
}

// The names in the folder `dir`, sorted.
inline std::vector<std::string> FolderEntries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace plait::base::testing

#endif  // PLAIT_BASE_TEST_PATHS_H_
