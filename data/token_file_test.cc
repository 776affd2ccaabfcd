#include "data/token_file.h"

#include <cstdint>
#include <vector>

#include "base/status_matchers.h"
#include "data/testing_token_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::data {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::plait::base::testing::TestPath;
using ::plait::data::testing::Iota;
using ::plait::data::testing::WriteLlmc;
using ::plait::data::testing::WriteRaw;
using ::testing::HasSubstr;

TEST(TokenFileTest, ReadsLlmcAndRawFiles) {
  absl::StatusOr<TokenFile> llmc =
      TokenFile::Open(WriteLlmc("a.bin", Iota(100)), TOKEN_FORMAT_LLMC, 100);
  ASSERT_THAT(llmc, IsOk());
  EXPECT_EQ(llmc->size(), 100);
  EXPECT_TRUE(llmc->Read(10, 3).equal(torch::tensor({10, 11, 12}, torch::kInt64)));

  absl::StatusOr<TokenFile> u16 =
      TokenFile::Open(WriteRaw<uint16_t>("b.bin", {5, 6, 7}), TOKEN_FORMAT_UINT16, 8);
  ASSERT_THAT(u16, IsOk());
  EXPECT_TRUE(u16->Read(0, 3).equal(torch::tensor({5, 6, 7}, torch::kInt64)));

  absl::StatusOr<TokenFile> u32 =
      TokenFile::Open(WriteRaw<uint32_t>("c.bin", {70000, 1}), TOKEN_FORMAT_UINT32, 128256);
  ASSERT_THAT(u32, IsOk());
  EXPECT_TRUE(u32->Read(0, 2).equal(torch::tensor({70000, 1}, torch::kInt64)));
}

TEST(TokenFileTest, BadFilesAreErrorsNamingTheFileAndTheProblem) {
  const std::string bad_magic = WriteLlmc("magic.bin", Iota(10), 20240519);
  EXPECT_THAT(
      TokenFile::Open(bad_magic, TOKEN_FORMAT_LLMC, 100),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(bad_magic + ": bad magic 20240519")));
  EXPECT_THAT(
      TokenFile::Open(WriteLlmc("version.bin", Iota(10), kLlmcMagic, 2), TOKEN_FORMAT_LLMC, 100),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("llm.c version 2")));
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
