// A file of token ids, read through its descriptor: llm.c's format (a header of 256 int32:
// magic, version, token count; then the tokens: magic 20240520 version 1 for uint16 tokens,
// GPT-2's, or magic 20240801 version 7 for uint32 tokens, llm.c's Llama 3 shards) or raw
// uint16 / uint32 tokens.
// Opening checks the whole file, so a bad file fails before training with an error naming
// the file and the problem (bad magic, unsupported version, truncated, token id >= vocab
// size). A run may last days, and a token file can change under it; each Read therefore
// checks that the file still has the size and modification time it had when opened, and
// that every token it returns is below the vocab size, so a file truncated or rewritten in
// place during the run is a DataLoss error naming the file, not a crash:
//
//   PLAIT_ASSIGN_OR_RETURN(TokenFile file, TokenFile::Open(path, TOKEN_FORMAT_LLMC, 50257));
//   PLAIT_ASSIGN_OR_RETURN(at::Tensor window, file.Read(/*offset=*/0, /*count=*/B * T + 1));
//
// A file replaced by a rename keeps being read from the one opened (the descriptor holds it),
// so the run goes on with the tokens it started with.
#ifndef PLAIT_DATA_TOKEN_FILE_H_
#define PLAIT_DATA_TOKEN_FILE_H_

#include <sys/types.h>
#include <time.h>

#include <cstdint>
#include <string>
#include <utility>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/data.pb.h"

namespace plait::data {

// llm.c's token file headers (llm.c, dev/data/data_common.py: HEADERS_INFO, write_datafile):
// its magic and version for uint16 tokens (GPT-2's vocabulary) and for uint32 tokens (Llama
// 3's), then the token count, in 256 int32.
inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;  // uint16 tokens
inline constexpr int32_t kLlmcUint32Magic = 20240801;
inline constexpr int32_t kLlmcUint32Version = 7;  // uint32 tokens
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

  // Tokens offset .. offset+count-1 as int64 [count]. OutOfRange when the range does not lie
  // in the file; DataLoss, naming the file, the range and what changed, when the file is no
  // longer the one opened (another size or modification time, a short read, a token not
  // below the vocab size).
  absl::StatusOr<at::Tensor> Read(int64_t offset, int64_t count) const;

 private:
  TokenFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  // Reads tokens first .. first+count-1, as they are in the file, into `buffer`; DataLoss when
  // the file ends first.
  absl::Status ReadTokens(int64_t first, int64_t count, char* buffer) const;

  // OK when the file still has the size and modification time it had when opened; the
  // error names the tokens being read, first .. first+count-1.
  absl::Status CheckUnchanged(int64_t first, int64_t count) const;

  std::string path_;
  int fd_ = -1;
  int64_t data_start_ = 0;  // bytes before the first token: llm.c's header, or none
  int width_ = 2;           // bytes per token
  int64_t size_ = 0;        // tokens
  int64_t vocab_size_ = 0;
  // What fstat said at Open; Read compares.
  off_t file_bytes_ = 0;
  timespec modified_ = {};
};

}  // namespace plait::data

#endif  // PLAIT_DATA_TOKEN_FILE_H_
