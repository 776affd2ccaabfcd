#include "models/safetensors.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/equal.h"
#include "absl/strings/str_cat.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::models {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::plait::base::testing::TestPath;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A safetensors file built by hand: the 8-byte length (of `header`, unless `length` is
// given), the header text, then `data_size` zero bytes.
std::string Handmade(const std::string& name, const std::string& header, size_t data_size,
                     int64_t length = -1) {
  const uint64_t n = length < 0 ? header.size() : static_cast<uint64_t>(length);
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  bytes += header;
  bytes.append(data_size, '\0');
  const std::string path = TestPath(name);
  WriteBytes(path, bytes);
  return path;
}

TEST(SafetensorsTest, WriteThenReadIsBitExactForEveryDtype) {
  at::manual_seed(1);
  const at::Tensor f32 = torch::randn({3, 5});
  const std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"f32", f32},
      {"bf16", torch::randn({4, 2, 3}).to(at::kBFloat16)},
      {"f16", torch::randn({7}).to(at::kHalf)},
      {"i64", torch::randint(-1000000000000LL, 1000000000000LL, {2, 2}, at::kLong)},
      {"transposed", f32.t()},
      {"scalar", torch::tensor(2.5f)},
      {"empty", torch::empty({0, 4})},
  };
  const std::string path = TestPath("round_trip.safetensors");
  ASSERT_THAT(WriteSafetensors(path, tensors, {{"format", "pt"}, {"step", "12"}}), IsOk());
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_THAT(file, IsOk());
  EXPECT_EQ((*file)->metadata().at("step"), "12");
  EXPECT_EQ((*file)->entries().size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    absl::StatusOr<at::Tensor> read = (*file)->Read(name);
    ASSERT_THAT(read, IsOk()) << name;
    EXPECT_EQ(read->scalar_type(), tensor.scalar_type()) << name;
    EXPECT_EQ(read->sizes(), tensor.sizes()) << name;
    // Bit-exact: compare the raw bytes, not values.
    const at::Tensor expected = tensor.contiguous();
    ASSERT_EQ(read->nbytes(), expected.nbytes());
    EXPECT_EQ(std::memcmp(read->data_ptr(), expected.data_ptr(), expected.nbytes()), 0) << name;
  }
  EXPECT_THAT((*file)->Read("nope"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
  // The header is padded so the data starts 8-byte aligned.
  const std::string bytes = ReadBytes(path);
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  EXPECT_EQ(header_length % 8, 0u);
}

TEST(SafetensorsTest, WriteRejectsUnsupportedDtypeAndRepeatedNames) {
  const std::string path = TestPath("bad_write.safetensors");
  EXPECT_THAT(WriteSafetensors(path, {{"x", torch::zeros({2}, at::kInt)}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"x\" has dtype Int")));
  EXPECT_THAT(WriteSafetensors(path, {{"x", torch::zeros({2})}, {"x", torch::zeros({2})}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("repeated")));
}

struct CorruptCase {
  const char* name;
  std::string header;
  size_t data_size;
  int64_t length;  // header length written, -1 for the true one
  const char* message;
};

class CorruptFileTest : public ::testing::TestWithParam<CorruptCase> {};

TEST_P(CorruptFileTest, IsAnErrorNamingFileAndProblem) {
  const CorruptCase& c = GetParam();
  const std::string path =
      Handmade(absl::StrCat(c.name, ".safetensors"), c.header, c.data_size, c.length);
  EXPECT_THAT(SafetensorsFile::Open(path),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr(path), HasSubstr(c.message))));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CorruptFileTest,
    ::testing::Values(
        CorruptCase{"length_past_end", R"({})", 0, 1000, "header length 1000 runs past the end"},
        CorruptCase{"huge_length", R"({})", 0, INT64_MAX, "runs past the end of the file"},
        CorruptCase{"invalid_json", R"({"a": {"dtype": "F32",)", 0, -1, "not valid JSON"},
        CorruptCase{"not_object", R"([1, 2])", 0, -1, "not a JSON object"},
        CorruptCase{"offsets_outside",
                    R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8, -1,
                    "data_offsets [0, 16] lie outside the data (8 bytes)"},
        CorruptCase{"offsets_reversed",
                    R"({"a": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", 8, -1,
                    "lie outside the data"},
        CorruptCase{"overlap",
                    R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                    12, -1, "tensors \"a\" and \"b\" overlap"},
        CorruptCase{"size_mismatch",
                    R"({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 8]}})", 8, -1,
                    "dtype F32 and shape [2, 2] need 16 bytes"},
        CorruptCase{"dtype_mismatch",
                    R"({"a": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 16]}})", 16, -1,
                    "dtype BF16 and shape [4] need 8 bytes"},
        CorruptCase{"shape_overflow",
                    R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296, 16],
                              "data_offsets": [0, 0]}})",
                    0, -1, "its strides overflow 64 bits"},
        CorruptCase{"bytes_overflow",
                    R"({"a": {"dtype": "F32", "shape": [4611686018427387904],
                              "data_offsets": [0, 0]}})",
                    0, -1, "more than 2^64"},
        // No elements, yet strides LibTorch 2.x refuses to compute (it throws).
        CorruptCase{"empty_shape_overflow",
                    R"({"a": {"dtype": "F32", "shape": [0, 4294967296, 4294967296],
                              "data_offsets": [0, 0]}})",
                    0, -1, "its strides overflow 64 bits"},
        CorruptCase{"unsupported_dtype",
                    R"({"a": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}})", 1, -1,
                    "dtype \"F8_E4M3\" is not supported"},
        CorruptCase{"negative_shape",
                    R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4, -1,
                    "shape[0] is -1; a dimension is an integer in [0, 2^63)"},
        CorruptCase{"missing_offsets", R"({"a": {"dtype": "F32", "shape": [1]}})", 4, -1,
                    "data_offsets must be [begin, end]"},
        CorruptCase{"hole", R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8,
                    -1, "data bytes [0, 4) belong to no tensor"},
        CorruptCase{"trailing", R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
                    12, -1, "data bytes [4, 12) belong to no tensor"},
        CorruptCase{"bad_metadata", R"({"__metadata__": {"step": 3}})", 0, -1,
                    "__metadata__ value of \"step\" is not a string"}),
    [](const ::testing::TestParamInfo<CorruptCase>& info) { return info.param.name; });

// A header value nested far deeper than any real header is named by its type, not written
// out: writing it out recursed once per level and overflowed the stack.
TEST(SafetensorsTest, DeeplyNestedShapeIsAnErrorNotAStackOverflow) {
  constexpr int kDepth = 100000;
  const std::string header =
      absl::StrCat(R"({"a": {"dtype": "F32", "shape": [)", std::string(kDepth, '['),
                   std::string(kDepth, ']'), R"(], "data_offsets": [0, 0]}})");
  const std::string path = Handmade("deep.safetensors", header, 0);
  EXPECT_THAT(SafetensorsFile::Open(path),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor \"a\": shape[0] is an array; a dimension is an integer")));
}

TEST(SafetensorsTest, ShortFile) {
  const std::string path = TestPath("short.safetensors");
  WriteBytes(path, "abc");
  EXPECT_THAT(SafetensorsFile::Open(path),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is 3 bytes, shorter than the 8-byte header length")));
  EXPECT_THAT(SafetensorsFile::Open(path + ".absent"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(".absent")));
}

// Every truncation and many single-byte corruptions of a valid file are errors or valid
// files, never crashes or out-of-bounds reads (run under --config=asan to check the latter).
TEST(SafetensorsTest, TruncatedAndFlippedFilesNeverCrash) {
  const std::string path = TestPath("valid.safetensors");
  ASSERT_THAT(WriteSafetensors(path, {{"a", torch::ones({3})}, {"b", torch::ones({2, 2})}}),
              IsOk());
  const std::string bytes = ReadBytes(path);
  const std::string damaged = TestPath("damaged.safetensors");
  for (size_t size = 0; size < bytes.size(); ++size) {
    WriteBytes(damaged, bytes.substr(0, size));
    EXPECT_FALSE(SafetensorsFile::Open(damaged).ok()) << "truncated to " << size;
  }
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string flipped = bytes;
    flipped[i] = static_cast<char>(flipped[i] ^ 0x5a);
    WriteBytes(damaged, flipped);
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(damaged);
    if (file.ok()) {
      for (const auto& entry : (*file)->entries()) EXPECT_THAT((*file)->Read(entry.first), IsOk());
    }
  }
}

// Bytes of the file `path` that this process's mappings of it hold in memory (the Rss lines
// of /proc/self/smaps): pages become resident only when something reads them.
int64_t ResidentBytesOfMapping(const std::string& path) {
  std::ifstream smaps("/proc/self/smaps");
  int64_t kib = 0;
  bool in_mapping = false;
  for (std::string line; std::getline(smaps, line);) {
    const size_t colon = line.find(':');
    const bool is_field = colon != std::string::npos && line.find(' ') > colon;
    if (!is_field) {
      in_mapping = line.size() >= path.size() &&
                   line.compare(line.size() - path.size(), path.size(), path) == 0;
    } else if (in_mapping && line.rfind("Rss:", 0) == 0) {
      kib += std::stoll(line.substr(4));
    }
  }
  return kib * 1024;
}

// A tensor-parallel rank's slice of a tensor: the box's elements are read, converted to the
// destination's dtype, and nothing else is: the other rows may hold anything (NaN here), and
// of a 32 MiB tensor, reading an eighth of its rows leaves little more than an eighth of it
// resident in this process (the kernel maps a file's pages in runs of up to 2 MiB).
TEST(SafetensorsTest, ReadBoxReadsOnlyTheBox) {
  const std::string path = TestPath("box.safetensors");
  const at::Tensor full = torch::randn({4096, 2048});
  at::Tensor stored = full.clone();
  stored.narrow(0, 512, 3584).fill_(std::numeric_limits<float>::quiet_NaN());
  ASSERT_THAT(WriteSafetensors(path, {{"w", stored}}), IsOk());
  const int64_t file_bytes = stored.numel() * 4;
  {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
    ASSERT_THAT(file, IsOk());
    at::Tensor rows = torch::empty({512, 2048});
    ASSERT_THAT((*file)->ReadBox("w", {0, 0}, {512, 2048}, rows), IsOk());
    EXPECT_TRUE(at::equal(rows, full.narrow(0, 0, 512)));
    const int64_t resident = ResidentBytesOfMapping(path);
    EXPECT_GE(resident, file_bytes / 8);
    EXPECT_LE(resident, file_bytes / 8 + (4 << 20)) << "of " << file_bytes;

    at::Tensor box = torch::empty({3, 5}, at::kBFloat16);
    ASSERT_THAT((*file)->ReadBox("w", {509, 100}, {3, 5}, box), IsOk());
    EXPECT_TRUE(at::equal(box, full.narrow(0, 509, 3).narrow(1, 100, 5).to(at::kBFloat16)));
    // Into a strided view of a larger tensor (a rank's slice of its parameter), touching
    // nothing else.
    at::Tensor parameter = torch::zeros({3, 9}, at::kBFloat16);
    ASSERT_THAT((*file)->ReadBox("w", {509, 100}, {3, 5}, parameter.narrow(1, 2, 5)), IsOk());
    EXPECT_TRUE(at::equal(parameter.narrow(1, 2, 5), box));
    EXPECT_EQ(parameter.narrow(1, 0, 2).abs().max().item<float>(), 0.0f);
    EXPECT_EQ(parameter.narrow(1, 7, 2).abs().max().item<float>(), 0.0f);

    EXPECT_THAT((*file)->ReadBox("w", {4000, 0}, {100, 2048}, torch::empty({100, 2048})),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("box.safetensors: tensor \"w\" of shape [4096, 2048] has no "
                                   "box [4000:4100, 0:2048]")));
    EXPECT_THAT((*file)->ReadBox("w", {0}, {4}, torch::empty({4})),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("has no box [0:4]")));
    EXPECT_THAT((*file)->ReadBox("w", {0, 0}, {2, 2}, torch::empty({4})),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("the box [0:2, 0:2] of tensor \"w\" cannot be read into a "
                                   "tensor of shape [4]")));
    EXPECT_THAT((*file)->ReadBox("v", {0}, {1}, torch::empty({1})),
                StatusIs(absl::StatusCode::kNotFound, HasSubstr("no tensor \"v\"")));
  }
  EXPECT_EQ(ResidentBytesOfMapping(path), 0);  // unmapped with the file
}

// Values a diverged run saved are refused where they are read: a box holding a NaN or an
// infinity, stored in any float dtype, is an error naming the file and the tensor; the rest of
// the tensor reads as before.
TEST(SafetensorsTest, ReadBoxRefusesNonFiniteValues) {
  const std::string path = TestPath("non_finite.safetensors");
  at::Tensor w = torch::ones({4, 3});
  w[2][1] = std::numeric_limits<float>::quiet_NaN();
  at::Tensor b = torch::ones({5}, at::kBFloat16);
  b[4] = -std::numeric_limits<float>::infinity();
  ASSERT_THAT(WriteSafetensors(path, {{"w", w}, {"b", b}}), IsOk());
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_THAT(file, IsOk());
  EXPECT_THAT((*file)->ReadBox("w", {2, 0}, {1, 3}, torch::empty({1, 3})),
              StatusIs(absl::StatusCode::kInvalidArgument, path + ": w: holds NaN"));
  EXPECT_THAT((*file)->ReadBox("w", {0, 0}, {2, 3}, torch::empty({2, 3})), IsOk());
  EXPECT_THAT((*file)->ReadBox("b", {0}, {5}, torch::empty({5})),
              StatusIs(absl::StatusCode::kInvalidArgument, path + ": b: holds infinity"));
  EXPECT_THAT(CheckFinite(torch::arange(3), path, "i"), IsOk());
}

std::string FreshDir(const std::string& name) {
  const std::string dir = TestPath(name);
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  return dir;
}

TEST(SafetensorsCheckpointTest, ShardedRoundTrip) {
  const std::string dir = FreshDir("sharded");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (int i = 0; i < 5; ++i) tensors.push_back({absl::StrCat("t", i), torch::randn({8, 8})});
  // 256 bytes each; 600-byte shards hold two.
  ASSERT_THAT(WriteSafetensorsCheckpoint(dir, tensors, 600), IsOk());
  EXPECT_THAT(SafetensorsFile::Open(dir + "/model-00003-of-00003.safetensors"), IsOk());
  absl::StatusOr<SafetensorsCheckpoint> checkpoint = SafetensorsCheckpoint::Open(dir);
  ASSERT_THAT(checkpoint, IsOk());
  EXPECT_THAT(checkpoint->Names(), ElementsAre("t0", "t1", "t2", "t3", "t4"));
  for (const auto& [name, tensor] : tensors) {
    EXPECT_TRUE(at::equal(checkpoint->Read(name).value(), tensor)) << name;
  }
  EXPECT_THAT(checkpoint->Read("t9"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing tensor \"t9\"")));
}

TEST(SafetensorsCheckpointTest, SingleFile) {
  const std::string dir = FreshDir("single");
  ASSERT_THAT(WriteSafetensorsCheckpoint(dir, {{"w", torch::ones({2})}}), IsOk());
  absl::StatusOr<SafetensorsCheckpoint> checkpoint = SafetensorsCheckpoint::Open(dir);
  ASSERT_THAT(checkpoint, IsOk());
  EXPECT_THAT(checkpoint->Names(), ElementsAre("w"));
  EXPECT_THAT(SafetensorsCheckpoint::Open(FreshDir("none")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("model.safetensors")));
}

// Saving a single file where a sharded checkpoint was removes the old index, which would
// otherwise win and load the old shards.
TEST(SafetensorsCheckpointTest, SingleFileReplacesAShardedCheckpoint) {
  const std::string dir = FreshDir("resaved");
  ASSERT_THAT(
      WriteSafetensorsCheckpoint(dir, {{"w", torch::zeros({64})}, {"v", torch::zeros({64})}}, 300),
      IsOk());
  ASSERT_THAT(WriteSafetensorsCheckpoint(dir, {{"w", torch::ones({64})}}), IsOk());
  absl::StatusOr<SafetensorsCheckpoint> checkpoint = SafetensorsCheckpoint::Open(dir);
  ASSERT_THAT(checkpoint, IsOk());
  EXPECT_THAT(checkpoint->Names(), ElementsAre("w"));
  EXPECT_TRUE(at::equal(checkpoint->Read("w").value(), torch::ones({64})));
}

TEST(SafetensorsCheckpointTest, IndexDisagreeingWithFilesIsAnError) {
  const std::string dir = FreshDir("disagree");
  ASSERT_THAT(
      WriteSafetensors(dir + "/a.safetensors", {{"x", torch::ones({2})}, {"y", torch::ones({2})}}),
      IsOk());
  const std::string index = dir + "/model.safetensors.index.json";
  WriteBytes(index, R"({"weight_map": {"x": "a.safetensors", "z": "a.safetensors",
                                       "y": "a.safetensors"}})");
  EXPECT_THAT(SafetensorsCheckpoint::Open(dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("missing tensor \"z\": the index puts it in")));
  WriteBytes(index, R"({"weight_map": {"x": "a.safetensors"}})");
  EXPECT_THAT(SafetensorsCheckpoint::Open(dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a.safetensors: unexpected tensor \"y\"")));
  WriteBytes(index, R"({"weight_map": {"x": "../a.safetensors"}})");
  EXPECT_THAT(SafetensorsCheckpoint::Open(dir),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not a file name")));
  WriteBytes(index, R"({"weight_map": )");
  EXPECT_THAT(SafetensorsCheckpoint::Open(dir),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("index.json: not valid")));
}

}  // namespace
}  // namespace plait::models
