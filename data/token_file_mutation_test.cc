// TokenFile::Open against mutated copies of one valid llm.c token file: its header fields set
// to the values that break readers (magic, version, a token count of 0, negative, off by one,
// huge, INT32_MAX), then thousands of seeded random mutations (bytes set, bits flipped, the
// file cut short or extended). Each mutated file is either rejected with an error that names
// the file and says what is wrong, or accepted with every token readable and below the vocab
// size; a crash or an abort fails the test. Seeded, so a failure names a case that repeats.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "data/token_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::data {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::plait::base::testing::TestPath;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// GPT-2's vocabulary, llm.c's: uint16 ids above it are what a mutated token turns into.
constexpr int64_t kVocabSize = 50257;
constexpr int kTokens = 256;
constexpr int kHeaderBytes = kLlmcHeaderInts * 4;
constexpr int kRandomMutations = 5000;
constexpr uint32_t kSeed = 1;

// The valid file: the header, then kTokens random ids below kVocabSize.
std::string ValidFile() {
  std::vector<int32_t> header(kLlmcHeaderInts, 0);
  header[0] = kLlmcMagic;
  header[1] = kLlmcVersion;
  header[2] = kTokens;
  std::vector<uint16_t> tokens(kTokens);
  std::mt19937 random(kSeed);
  std::uniform_int_distribution<int> id(0, kVocabSize - 1);
  for (uint16_t& token : tokens) token = static_cast<uint16_t>(id(random));
  return std::string(reinterpret_cast<const char*>(header.data()), kHeaderBytes) +
         std::string(reinterpret_cast<const char*>(tokens.data()), kTokens * 2);
}

// `bytes` with the header's int32 `field` (0 magic, 1 version, 2 token count) set to `value`.
std::string WithField(std::string bytes, int field, int32_t value) {
  std::memcpy(bytes.data() + field * 4, &value, 4);
  return bytes;
}

// Opens `bytes`, written to a file, and checks that TokenFile either rejects it with a named
// error or reads every token of it; whether it was accepted.
bool ExpectNamedErrorOrReadable(const std::string& bytes) {
  const std::string path = TestPath("mutated.bin");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  absl::StatusOr<TokenFile> file = TokenFile::Open(path, TOKEN_FORMAT_LLMC, kVocabSize);
  if (!file.ok()) {
    EXPECT_THAT(file, StatusIs(absl::StatusCode::kInvalidArgument, StartsWith(path + ": ")));
    EXPECT_THAT(std::string(file.status().message()),
                AnyOf(HasSubstr("the file is empty"), HasSubstr(": bad magic "),
                      HasSubstr(": llm.c version "), HasSubstr("; an llm.c file holds some"),
                      HasSubstr(": truncated: "), HasSubstr(" bytes: trailing data"),
                      HasSubstr(", not below the model's vocab_size ")));
    return false;
  }
  // Accepted: the header was intact where it matters and every token is in the vocabulary.
  int32_t count;
  std::memcpy(&count, bytes.data() + 8, 4);
  EXPECT_EQ(file->size(), count);
  absl::StatusOr<at::Tensor> tokens = file->Read(0, file->size());
  EXPECT_THAT(tokens, IsOk());
  if (tokens.ok()) {
    EXPECT_LT(tokens->max().item<int64_t>(), kVocabSize);
    EXPECT_GE(tokens->min().item<int64_t>(), 0);
  }
  return true;
}

TEST(TokenFileMutationTest, HeaderFieldsThatBreakReadersAreNamedErrors) {
  const std::string valid = ValidFile();
  const std::string path = TestPath("field.bin");
  auto open = [&](const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    return TokenFile::Open(path, TOKEN_FORMAT_LLMC, kVocabSize);
  };
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  constexpr int32_t kMin = std::numeric_limits<int32_t>::min();
  ASSERT_THAT(open(valid), IsOk());
  for (const int32_t magic : {0, kLlmcMagic - 1, kLlmcMagic + 1, -kLlmcMagic, kMax, kMin}) {
    EXPECT_THAT(open(WithField(valid, 0, magic)),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         absl::StrCat(path, ": bad magic ", magic,
                                      "; an llm.c token file starts with 20240520 (uint16 "
                                      "tokens) or 20240801 (uint32 tokens)")));
  }
  for (const int32_t version : {0, 2, 3, -1, kMax, kMin}) {
    EXPECT_THAT(open(WithField(valid, 1, version)),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         absl::StrCat(path, ": llm.c version ", version,
                                      " with magic 20240520 is not supported (1: uint16 "
                                      "tokens)")));
  }
  for (const int32_t count : {0, -1, -kTokens, kMin}) {
    EXPECT_THAT(open(WithField(valid, 2, count)),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         absl::StrCat(path, ": the header says ", count,
                                      " tokens; an llm.c file holds some")));
  }
  for (const int32_t count : {kTokens + 1, 1 << 30, kMax}) {
    EXPECT_THAT(open(WithField(valid, 2, count)),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         absl::StrCat(path, ": truncated: the header says ", count, " tokens (",
                                      kHeaderBytes + int64_t{2} * count, " bytes), the file has ",
                                      valid.size(), " bytes")));
  }
  for (const int32_t count : {kTokens - 1, 1}) {
    EXPECT_THAT(open(WithField(valid, 2, count)),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         absl::StrCat(path, ": the header says ", count, " tokens (",
                                      kHeaderBytes + 2 * count, " bytes), the file has ",
                                      valid.size(), " bytes: trailing data")));
  }
}

TEST(TokenFileMutationTest, RandomMutationsAreNamedErrorsOrReadableFiles) {
  const std::string valid = ValidFile();
  std::mt19937 random(kSeed);
  auto below = [&](int64_t n) { return std::uniform_int_distribution<int64_t>(0, n - 1)(random); };
  // Where a byte mutation lands: half of them in magic, version and count (12 bytes), the
  // rest anywhere, so that the fields that matter see most of them.
  auto position = [&](const std::string& bytes) {
    return below(2) == 0 ? below(12) : below(static_cast<int64_t>(bytes.size()));
  };
  const int32_t interesting[] = {0,
                                 1,
                                 -1,
                                 kTokens - 1,
                                 kTokens + 1,
                                 std::numeric_limits<int32_t>::max(),
                                 std::numeric_limits<int32_t>::min()};
  int rejected = 0;
  for (int i = 0; i < kRandomMutations; ++i) {
    std::string bytes = valid;
    std::string what;
    // One to three mutations of these kinds, applied in turn.
    for (int64_t n = 1 + below(3); n > 0 && !bytes.empty(); --n) {
      switch (below(6)) {
        case 0: {
          const int64_t at = position(bytes);
          bytes[at] = static_cast<char>(below(256));
          absl::StrAppend(&what, "byte ", at, " set; ");
          break;
        }
        case 1: {
          const int64_t at = position(bytes);
          bytes[at] ^= static_cast<char>(1 << below(8));
          absl::StrAppend(&what, "a bit of byte ", at, " flipped; ");
          break;
        }
        case 2: {
          if (bytes.size() < 12) break;
          const int field = static_cast<int>(below(3));
          const int32_t value = below(2) == 0 ? interesting[below(std::size(interesting))]
                                              : static_cast<int32_t>(random());
          bytes = WithField(bytes, field, value);
          absl::StrAppend(&what, "field ", field, " set to ", value, "; ");
          break;
        }
        case 3: {
          const int64_t size = below(static_cast<int64_t>(bytes.size()));
          bytes.resize(size);
          absl::StrAppend(&what, "cut to ", size, " bytes; ");
          break;
        }
        case 4: {
          const int64_t extra = 1 + below(8);
          for (int64_t k = 0; k < extra; ++k) bytes.push_back(static_cast<char>(below(256)));
          absl::StrAppend(&what, extra, " bytes appended; ");
          break;
        }
        default: {
          const int64_t at = kHeaderBytes + 2 * below(kTokens);
          if (at + 2 > static_cast<int64_t>(bytes.size())) break;
          const uint16_t token = static_cast<uint16_t>(below(65536));
          std::memcpy(bytes.data() + at, &token, 2);
          absl::StrAppend(&what, "token at byte ", at, " set to ", token, "; ");
          break;
        }
      }
    }
    SCOPED_TRACE(absl::StrCat("mutation ", i, ": ", what));
    if (!ExpectNamedErrorOrReadable(bytes)) ++rejected;
    if (::testing::Test::HasFailure()) return;  // the first failing case says enough
  }
  // Both outcomes were exercised.
  EXPECT_GT(rejected, kRandomMutations / 4);
  EXPECT_LT(rejected, kRandomMutations);
}

}  // namespace
}  // namespace plait::data
