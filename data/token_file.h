// A memory-mapped file of token ids: llm.c's format (a header of 256 int32: magic 20240520,
// version 1, token count; then uint16 tokens) or raw uint16 / uint32 tokens. Opening checks
// the whole file, so a bad file fails before training with an error naming the file and the
// problem (bad magic, unsupported version, truncated, token id >= vocab size):
//
//   PLAIT_ASSIGN_OR_RETURN(TokenFile file, TokenFile::Open(path, TOKEN_FORMAT_LLMC, 50257));
//   torch::Tensor window = file.Read(/*offset=*/0, /*count=*/B * T + 1);  // int64
#ifndef PLAIT_DATA_TOKEN_FILE_H_
#define PLAIT_DATA_TOKEN_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "data/data.pb.h"
#include "torch/torch.h"

namespace plait::data {

// llm.c's token file header (llm.c, dev/data/data_common.py: write_datafile).
inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;  // uint16 tokens
inline constexpr int kLlmcHeaderInts = 256;

class TokenFile {
 public:
  static absl::StatusOr<TokenFile> Open(const std::string& path, TokenFormat format,
                                        int64_t vocab_size);

  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile();

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }  // tokens

  // Tokens offset .. offset+count-1 as int64 [count]; the range must lie in the file.
  torch::Tensor Read(int64_t offset, int64_t count) const;

 private:
  TokenFile(std::string path, void* map, size_t map_bytes, const void* tokens, int width,
            int64_t size);
  int64_t Token(int64_t i) const;

  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const void* tokens_ = nullptr;
  int width_ = 2;  // bytes per token
  int64_t size_ = 0;
};

}  // namespace plait::data

#endif  // PLAIT_DATA_TOKEN_FILE_H_
