// Test helpers: writes token files in llm.c's format or raw, for the data tests and
// data_bench.
#ifndef PLAIT_DATA_TESTING_TOKEN_FILES_H_
#define PLAIT_DATA_TESTING_TOKEN_FILES_H_

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "base/test_paths.h"
#include "data/token_file.h"

namespace plait::data::testing {

// Writes an llm.c token file at `path`; `magic`, `version` and `count` override the header's
// values.
inline void WriteLlmcFile(const std::string& path, const std::vector<uint16_t>& tokens,
                          int32_t magic = kLlmcMagic, int32_t version = kLlmcVersion,
                          int32_t count = -1) {
  std::vector<int32_t> header(kLlmcHeaderInts, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count >= 0 ? count : static_cast<int32_t>(tokens.size());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), header.size() * sizeof(int32_t));
  out.write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint16_t));
}

// WriteLlmcFile into the test's temporary folder, as `name`; its path.
inline std::string WriteLlmc(const std::string& name, const std::vector<uint16_t>& tokens,
                             int32_t magic = kLlmcMagic, int32_t version = kLlmcVersion,
                             int32_t count = -1) {
  const std::string path = base::testing::TestPath(name);
  WriteLlmcFile(path, tokens, magic, version, count);
  return path;
}

// Writes raw tokens of type T.
template <typename T>
std::string WriteRaw(const std::string& name, const std::vector<T>& tokens) {
  const std::string path = base::testing::TestPath(name);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(T));
  return path;
}

// 0, 1, ..., n-1.
inline std::vector<uint16_t> Iota(int n) {
  std::vector<uint16_t> tokens(n);
  for (int i = 0; i < n; ++i) tokens[i] = static_cast<uint16_t>(i);
  return tokens;
}

}  // namespace plait::data::testing

#endif  // PLAIT_DATA_TESTING_TOKEN_FILES_H_
