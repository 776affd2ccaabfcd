#include "data/token_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "base/status_matchers.h"
#include "data/testing_token_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::data {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::plait::base::testing::TestPath;
using ::plait::data::testing::Iota;
using ::plait::data::testing::WriteLlmc;
using ::plait::data::testing::WriteRaw;
using ::testing::HasSubstr;

// The file's modification time.
timespec Modified(const std::string& path) {
  struct stat info;
  EXPECT_EQ(stat(path.c_str(), &info), 0) << path;
  return info.st_mtim;
}

// Sets the file's modification time to `when`.
void SetModified(const std::string& path, timespec when) {
  const timespec times[2] = {when, when};  // access, modification
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
}

// Writes `tokens` over the file's tokens from token `first` on, in place (no truncation,
// the size kept), as a program rewriting a shared file would.
void OverwriteTokens(const std::string& path, int64_t first, const std::vector<uint16_t>& tokens) {
  const int fd = open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << path;
  const size_t bytes = tokens.size() * sizeof(uint16_t);
  EXPECT_EQ(pwrite(fd, tokens.data(), bytes, kLlmcHeaderInts * 4 + first * 2),
            static_cast<ssize_t>(bytes));
  close(fd);
}

TEST(TokenFileTest, ReadsLlmcAndRawFiles) {
  absl::StatusOr<TokenFile> llmc =
      TokenFile::Open(WriteLlmc("a.bin", Iota(100)), TOKEN_FORMAT_LLMC, 100);
  ASSERT_THAT(llmc, IsOk());
  EXPECT_EQ(llmc->size(), 100);
  EXPECT_TRUE(llmc->Read(10, 3)->equal(torch::tensor({10, 11, 12}, at::kLong)));

  absl::StatusOr<TokenFile> u16 =
      TokenFile::Open(WriteRaw<uint16_t>("b.bin", {5, 6, 7}), TOKEN_FORMAT_UINT16, 8);
  ASSERT_THAT(u16, IsOk());
  EXPECT_TRUE(u16->Read(0, 3)->equal(torch::tensor({5, 6, 7}, at::kLong)));

  absl::StatusOr<TokenFile> u32 =
      TokenFile::Open(WriteRaw<uint32_t>("c.bin", {70000, 1}), TOKEN_FORMAT_UINT32, 128256);
  ASSERT_THAT(u32, IsOk());
  EXPECT_TRUE(u32->Read(0, 2)->equal(torch::tensor({70000, 1}, at::kLong)));
}

// llm.c's uint32 shards (its Llama 3 header: magic 20240801, version 7) are read as llm.c's
// format; a header of one kind with the other's version, a count the file does not hold, or an
// unknown magic is refused, naming the file.
TEST(TokenFileTest, ReadsLlmcUint32FilesAndChecksTheirHeader) {
  const auto write = [](const std::string& name, const std::vector<int32_t>& header,
                        const std::vector<uint32_t>& tokens) {
    std::vector<uint32_t> words(header.begin(), header.end());
    words.resize(kLlmcHeaderInts, 0);
    words.insert(words.end(), tokens.begin(), tokens.end());
    return WriteRaw<uint32_t>(name, words);
  };
  const std::vector<uint32_t> tokens = {70000, 1, 128255};
  absl::StatusOr<TokenFile> file =
      TokenFile::Open(write("llama3.bin", {kLlmcUint32Magic, kLlmcUint32Version, 3}, tokens),
                      TOKEN_FORMAT_LLMC, 128256);
  ASSERT_THAT(file, IsOk());
  EXPECT_EQ(file->size(), 3);
  EXPECT_TRUE(file->Read(0, 3)->equal(torch::tensor({70000, 1, 128255}, at::kLong)));
  const std::string mixed = write("mixed.bin", {kLlmcUint32Magic, kLlmcVersion, 3}, tokens);
  EXPECT_THAT(TokenFile::Open(mixed, TOKEN_FORMAT_LLMC, 128256),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       mixed + ": llm.c version 1 with magic 20240801 is not supported (7: "
                               "uint32 tokens)"));
  const std::string long_count =
      write("count.bin", {kLlmcUint32Magic, kLlmcUint32Version, 4}, tokens);
  EXPECT_THAT(TokenFile::Open(long_count, TOKEN_FORMAT_LLMC, 128256),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("truncated: the header says 4 tokens (1040 bytes), the file has "
                                 "1036 bytes")));
  const std::string unknown = write("magic.bin", {20240802, kLlmcUint32Version, 3}, tokens);
  EXPECT_THAT(TokenFile::Open(unknown, TOKEN_FORMAT_LLMC, 128256),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       unknown + ": bad magic 20240802; an llm.c token file starts with 20240520 "
                                 "(uint16 tokens) or 20240801 (uint32 tokens)"));
}

TEST(TokenFileTest, ReadsOutsideTheFileAreErrors) {
  const std::string path = WriteLlmc("range.bin", Iota(10));
  absl::StatusOr<TokenFile> file = TokenFile::Open(path, TOKEN_FORMAT_LLMC, 100);
  ASSERT_THAT(file, IsOk());
  EXPECT_THAT(file->Read(8, 2), IsOk());
  EXPECT_THAT(file->Read(8, 3),
              StatusIs(absl::StatusCode::kOutOfRange,
                       path + ": tokens 8..10 are not all in the file's 10 tokens"));
  EXPECT_THAT(file->Read(-1, 2), StatusIs(absl::StatusCode::kOutOfRange, HasSubstr(path)));
}

// Truncating a file under a running job used to kill it with SIGBUS (the file was
// memory-mapped); now the read is an error naming the file, the tokens and the sizes.
TEST(TokenFileTest, AFileTruncatedAfterOpenIsADataLossError) {
  const std::string path = WriteLlmc("truncated_later.bin", Iota(100));
  absl::StatusOr<TokenFile> file = TokenFile::Open(path, TOKEN_FORMAT_LLMC, 100);
  ASSERT_THAT(file, IsOk());
  ASSERT_THAT(file->Read(90, 10), IsOk());
  ASSERT_EQ(truncate(path.c_str(), 1024 + 2 * 40), 0);
  EXPECT_THAT(file->Read(90, 10),
              StatusIs(absl::StatusCode::kDataLoss,
                       path + ": the file changed after it was opened: it held 100 tokens (1224 "
                              "bytes) when opened and now has 1104 bytes (it was truncated or "
                              "written to), reading tokens 90..99; a token file must not change "
                              "while a run reads it"));
  // Also the tokens still in the file: what was checked is gone.
  EXPECT_THAT(file->Read(0, 10), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("1104 bytes")));
}

// A file rewritten in place keeps its size. A new modification time gives it away; a writer
// that puts the old time back (as `cp -p` or `rsync -t` would) is caught by its tokens when
// one is out of the vocabulary, which would otherwise abort the embedding lookup.
TEST(TokenFileTest, AFileRewrittenInPlaceIsADataLossError) {
  const std::string path = WriteLlmc("rewritten.bin", Iota(100));
  // An hour ago, so the rewrite below gets a later time even within the clock's resolution.
  timespec opened = Modified(path);
  opened.tv_sec -= 3600;
  SetModified(path, opened);
  absl::StatusOr<TokenFile> file = TokenFile::Open(path, TOKEN_FORMAT_LLMC, 100);
  ASSERT_THAT(file, IsOk());
  OverwriteTokens(path, 10, {1, 2, 3});
  EXPECT_THAT(
      file->Read(0, 20),
      StatusIs(absl::StatusCode::kDataLoss,
               path + ": the file changed after it was opened: it has the size it was "
                      "opened with but a new modification time (it was rewritten in place), "
                      "reading tokens 0..19; a token file must not change while a run "
                      "reads it"));

  OverwriteTokens(path, 50, {7, 60000, 7});
  SetModified(path, opened);
  EXPECT_THAT(file->Read(0, 50), IsOk());
  EXPECT_THAT(file->Read(40, 20),
              StatusIs(absl::StatusCode::kDataLoss,
                       path + ": the file changed after it was opened: token 51 is 60000, not "
                              "below the model's vocab_size 100 (it was rewritten in place); a "
                              "token file must not change while a run reads it"));
}

// The descriptor holds the file opened: a run goes on reading it when it is deleted or
// replaced by a rename, which leave it unchanged.
TEST(TokenFileTest, AFileDeletedOrReplacedAfterOpenIsStillRead) {
  const std::string path = WriteLlmc("replaced.bin", Iota(100));
  absl::StatusOr<TokenFile> file = TokenFile::Open(path, TOKEN_FORMAT_LLMC, 100);
  ASSERT_THAT(file, IsOk());
  const std::string other = WriteLlmc("other.bin", std::vector<uint16_t>(100, 7));
  ASSERT_EQ(std::rename(other.c_str(), path.c_str()), 0);
  EXPECT_TRUE(file->Read(10, 3)->equal(torch::tensor({10, 11, 12}, at::kLong)));
  ASSERT_EQ(std::remove(path.c_str()), 0);
  EXPECT_TRUE(file->Read(20, 3)->equal(torch::tensor({20, 21, 22}, at::kLong)));
}

TEST(TokenFileTest, BadFilesAreErrorsNamingTheFileAndTheProblem) {
  const std::string bad_magic = WriteLlmc("magic.bin", Iota(10), 20240519);
  EXPECT_THAT(
      TokenFile::Open(bad_magic, TOKEN_FORMAT_LLMC, 100),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(bad_magic + ": bad magic 20240519")));
  EXPECT_THAT(
      TokenFile::Open(WriteLlmc("version.bin", Iota(10), kLlmcMagic, 2), TOKEN_FORMAT_LLMC, 100),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("llm.c version 2")));
  const std::string empty = WriteLlmc("no_tokens.bin", {}, kLlmcMagic, kLlmcVersion, 0);
  EXPECT_THAT(TokenFile::Open(empty, TOKEN_FORMAT_LLMC, 100),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       empty + ": the header says 0 tokens; an llm.c file holds some"));
  const std::string truncated = WriteLlmc("truncated.bin", Iota(10), kLlmcMagic, 1, 20);
  EXPECT_THAT(TokenFile::Open(truncated, TOKEN_FORMAT_LLMC, 100),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(truncated + ": truncated: the header says 20 tokens")));
  EXPECT_THAT(
      TokenFile::Open(WriteRaw<uint16_t>("header_only.bin", {1, 2}), TOKEN_FORMAT_LLMC, 100),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("truncated")));
  const std::string big = WriteLlmc("vocab.bin", {1, 2, 300, 4});
  EXPECT_THAT(TokenFile::Open(big, TOKEN_FORMAT_LLMC, 256),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(big + ": token 2 is 300, not below the model's vocab_size 256")));
  const std::string odd = TestPath("odd.bin");
  { std::ofstream(odd, std::ios::binary) << "abc"; }
  EXPECT_THAT(TokenFile::Open(odd, TOKEN_FORMAT_UINT16, 100),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("3 bytes is not a whole number of 2-byte tokens")));
  EXPECT_THAT(TokenFile::Open(TestPath("missing.bin"), TOKEN_FORMAT_UINT16, 100),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing.bin: cannot open")));
}

}  // namespace
}  // namespace plait::data
