// Thousands of seeded mutations of a valid safetensors file, each opened and read in full
// through SafetensorsFile: the 8-byte header length, the header's bytes, numbers and JSON
// values (dtypes, shapes, data_offsets, duplicate names, deep nesting) and the data. Every
// outcome must be a file whose tensors fit in it or an error naming the file and the
// problem; a crash, an abort, an escaping exception or a hang fails the test (naming the
// case). Run under --config=asan too, for reads out of bounds.
#include <cstdint>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "base/file.h"
#include "base/status.h"
#include "base/test_paths.h"
#include "base/testing_mutations.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/safetensors.h"
#include "nlohmann/json.hpp"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::models {
namespace {

using ::plait::base::testing::MutationCases;
using ::plait::base::testing::Mutator;
using ::plait::base::testing::TestPath;
using ::plait::base::testing::WriteCaseFile;
using Json = nlohmann::json;

constexpr uint32_t kSeed = 20240611;
// Deep enough to overflow the stack of code that walks the parsed header recursively.
constexpr int kDeepNesting = 100000;

std::string LengthPrefix(uint64_t length) {
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  return bytes;
}

// A valid file's parts: its header text (padding included) and its data.
struct Parts {
  std::string header;
  std::string data;
};

Parts Split(const std::string& file) {
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= uint64_t{static_cast<unsigned char>(file[i])} << (8 * i);
  return {file.substr(8, length), file.substr(8 + length)};
}

// The header `json` as text with its members in `order`, a name given twice when `order`
// repeats it (nlohmann's objects cannot hold a duplicate).
std::string HeaderText(const Json& json, const std::vector<std::string>& order) {
  std::vector<std::string> members;
  for (const std::string& name : order) {
    members.push_back(absl::StrCat(Json(name).dump(), ":", json.at(name).dump()));
  }
  return absl::StrCat("{", absl::StrJoin(members, ","), "}");
}

// Opens `path` and reads every tensor; the tensors of an accepted file fit in it.
absl::Status OpenAndReadAll(const std::string& path, size_t file_size) {
  PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
  size_t bytes = 0;
  for (const auto& [name, entry] : file->entries()) {
    PLAIT_ASSIGN_OR_RETURN(const at::Tensor tensor, file->Read(name));
    EXPECT_EQ(tensor.sizes().vec(), entry.shape) << name;
    bytes += tensor.nbytes();
  }
  EXPECT_LE(bytes, file_size) << "the tensors read hold more bytes than the file";
  return absl::OkStatus();
}

TEST(SafetensorsMutationTest, EveryMutationIsReadOrANamedError) {
  at::manual_seed(1);
  const std::string valid_path = TestPath("valid.safetensors");
  ASSERT_TRUE(WriteSafetensors(valid_path,
                               {{"f32", torch::randn({3, 5})},
                                {"bf16", torch::randn({4, 2, 3}).to(at::kBFloat16)},
                                {"f16", torch::randn({7}).to(at::kHalf)},
                                {"i64", torch::arange(4, at::kLong).reshape({2, 2})},
                                {"scalar", torch::tensor(2.5f)},
                                {"empty", torch::empty({0, 4})}},
                               {{"format", "pt"}})
                  .ok());
  const std::string valid = base::ReadFile(valid_path).value();
  const Parts parts = Split(valid);
  const Json header = Json::parse(parts.header);
  std::vector<std::string> names;
  for (auto it = header.begin(); it != header.end(); ++it) names.push_back(it.key());
  std::vector<std::string> tensor_names;
  for (const std::string& name : names) {
    if (name != "__metadata__") tensor_names.push_back(name);
  }

  Mutator mutator(kSeed);
  // The file from a mutated header, with its true length.
  auto with_header = [&](const std::string& text) {
    return absl::StrCat(LengthPrefix(text.size()), text, parts.data);
  };
  // A random entry's field set to `value`.
  auto set_field = [&](const char* field, const Json& value, std::string& file) {
    Json json = header;
    const std::string& name = mutator.Pick(tensor_names);
    json[name][field] = value;
    file = with_header(json.dump());
    return absl::StrCat(name, ".", field, " = ", value.dump());
  };
  auto extreme = [&] { return mutator.Pick(base::testing::ExtremeIntegers()); };

  struct Kind {
    const char* name;
    int count;
    std::function<std::string(std::string& file)> mutate;
  };
  const std::vector<Kind> kinds = {
      {"byte edit anywhere", 1500, [&](std::string& file) { return mutator.MutateBytes(file); }},
      {"header length", 300,
       [&](std::string& file) {
         const std::vector<uint64_t> lengths = {0,
                                                1,
                                                parts.header.size() - 1,
                                                parts.header.size() + 1,
                                                valid.size() - 8,
                                                valid.size() - 7,
                                                uint64_t{1} << 32,
                                                uint64_t{1} << 63,
                                                std::numeric_limits<uint64_t>::max(),
                                                mutator.Below(valid.size())};
         const uint64_t length = mutator.Pick(lengths);
         file.replace(0, 8, LengthPrefix(length));
         return absl::StrCat("header length ", length);
       }},
      {"header byte edit", 1000,
       [&](std::string& file) {
         std::string text = parts.header;
         const std::string what = mutator.MutateBytes(text);
         file = with_header(text);
         return what;
       }},
      {"header number", 1000,
       [&](std::string& file) {
         std::string text = parts.header;
         const std::string what = mutator.ReplaceNumber(text);
         file = with_header(text);
         return what;
       }},
      {"header JSON value", 1000,
       [&](std::string& file) {
         Json json = header;
         const std::string what = mutator.MutateJson(json);
         file = with_header(json.dump());
         return what;
       }},
      {"shape", 400,
       [&](std::string& file) {
         switch (mutator.Below(4)) {
           case 0:
             return set_field("shape", Json::array({extreme()}), file);
           case 1:
             return set_field("shape", Json::array({extreme(), extreme()}), file);
           case 2:  // 2^62 elements, 2^64 elements, and a product that overflows to 0
             return set_field("shape",
                              mutator.Pick(std::vector<Json>{
                                  Json::array({int64_t{1} << 62}),
                                  Json::array({int64_t{1} << 31, int64_t{1} << 31}),
                                  Json::array({int64_t{1} << 32, int64_t{1} << 32}),
                                  Json::array({int64_t{1} << 32, int64_t{1} << 32, 0}),
                                  Json::array({0, int64_t{1} << 62, int64_t{1} << 62}),
                              }),
                              file);
           default:
             return set_field("shape", Json::array({3, -5}), file);
         }
       }},
      {"data_offsets", 400,
       [&](std::string& file) {
         const uint64_t size = parts.data.size();
         switch (mutator.Below(4)) {
           case 0:
             return set_field("data_offsets", Json::array({extreme(), extreme()}), file);
           case 1:  // reversed
             return set_field("data_offsets", Json::array({size, uint64_t{0}}), file);
           case 2:  // another tensor's bytes, overlapping it
             return set_field("data_offsets", header[mutator.Pick(tensor_names)]["data_offsets"],
                              file);
           default:
             return set_field("data_offsets",
                              Json::array({mutator.Below(size + 1), size + mutator.Below(9)}),
                              file);
         }
       }},
      {"dtype", 300,
       [&](std::string& file) {
         return set_field("dtype",
                          mutator.Pick(std::vector<Json>{"F32", "BF16", "F16", "I64", "F64", "I32",
                                                         "U8", "BOOL", "F8_E4M3", "f32", "", 32}),
                          file);
       }},
      {"duplicate name", 200,
       [&](std::string& file) {
         // A name given twice, with its own entry again or with another's.
         std::vector<std::string> order = names;
         const std::string& name = mutator.Pick(tensor_names);
         Json json = header;
         const std::string& other = mutator.Pick(tensor_names);
         order.insert(order.begin() + static_cast<ptrdiff_t>(mutator.Below(order.size() + 1)),
                      name);
         std::string text = HeaderText(json, order);
         if (other != name) {  // the copy gets the other's entry
           const std::string mine = absl::StrCat(Json(name).dump(), ":", json[name].dump());
           const size_t second = text.find(mine, text.find(mine) + 1);
           text.replace(second, mine.size(),
                        absl::StrCat(Json(name).dump(), ":", json[other].dump()));
         }
         file = with_header(text);
         return absl::StrCat("\"", name, "\" twice, the second with \"", other, "\"'s entry");
       }},
      {"not JSON", 100,
       [&](std::string& file) {
         const std::string text = mutator.Pick(std::vector<std::string>{
             "", " ", "null", "[]", "\"x\"", "{", "}", "{\"a\":}", std::string(64, '\0'),
             "\xef\xbb\xbf{}",
             "{\"a\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, "
             "4]}} trailing"});
         file = with_header(text);
         return absl::StrCat("header ", absl::CHexEscape(text));
       }},
      {"deep nesting", 10,
       [&](std::string& file) {
         std::string text = parts.header;
         const std::string what = mutator.Below(2) == 0
                                      ? mutator.NestNumber(text, kDeepNesting, "[", "]")
                                      : mutator.NestNumber(text, kDeepNesting, "{\"a\":", "}");
         file = with_header(text);
         return what;
       }},
      {"data byte edit", 300,
       [&](std::string& file) {
         std::string data = parts.data;
         const std::string what = mutator.MutateBytes(data);
         file = absl::StrCat(LengthPrefix(parts.header.size()), parts.header, data);
         return what;
       }},
  };

  const std::string path = TestPath("mutated.safetensors");
  MutationCases cases(absl::Seconds(10));
  for (const Kind& kind : kinds) {
    for (int i = 0; i < kind.count; ++i) {
      std::string file = valid;
      const std::string what = absl::StrCat(kind.name, " #", i, ": ", kind.mutate(file));
      WriteCaseFile(path, file);
      const absl::Status status =
          cases.Run(kind.name, what, [&] { return OpenAndReadAll(path, file.size()); });
      if (status.ok()) continue;
      // Named: the file, then the problem.
      EXPECT_TRUE(absl::StartsWith(status.message(), path + ": ") &&
                  status.message().size() > path.size() + 2)
          << what << "\n  " << status;
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << what << "\n  " << status;
    }
  }
  const std::string summary = cases.Summary("safetensors mutations");
  std::cout << summary;
  ::testing::Test::RecordProperty("accepted", cases.accepted());
  ::testing::Test::RecordProperty("rejected", cases.rejected());
}

}  // namespace
}  // namespace plait::models
