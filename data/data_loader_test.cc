#include "data/data_loader.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/cat.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "data/data_config.h"
#include "data/testing_token_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::data {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::plait::data::testing::Iota;
using ::plait::data::testing::WriteLlmc;
using ::testing::HasSubstr;

DataConfig Files(const std::string& train, const std::string& eval) {
  DataConfig data;
  data.mutable_token_files()->set_train_path(train);
  data.mutable_token_files()->set_eval_path(eval);
  data.mutable_token_files()->set_format(TOKEN_FORMAT_LLMC);
  return data;
}

// The first input token of each of the next `n` batches.
std::vector<int64_t> Starts(DataLoader& loader, int n) {
  std::vector<int64_t> starts;
  for (int i = 0; i < n; ++i) starts.push_back(loader.Next().value().inputs[0][0].item<int64_t>());
  return starts;
}

TEST(DataLoaderTest, OneRankFollowsLlmc) {
  // 40 tokens, B=2, T=3: batches at 0, 6, ..., 30; after 30, 36 + 7 > 40 starts over.
  const std::string path = WriteLlmc("one.bin", Iota(40));
  absl::StatusOr<DataLoader> loader =
      DataLoader::Create(Files(path, path), Split::kTrain, 100, 2, 3, 0, 1, "data");
  ASSERT_THAT(loader, IsOk());
  const Batch first = loader->Next().value();
  EXPECT_TRUE(first.inputs.equal(torch::tensor({{0, 1, 2}, {3, 4, 5}}, at::kLong)));
  EXPECT_TRUE(first.targets.equal(torch::tensor({{1, 2, 3}, {4, 5, 6}}, at::kLong)));
  EXPECT_THAT(Starts(*loader, 6), ::testing::ElementsAre(6, 12, 18, 24, 30, 0));
  EXPECT_EQ(loader->DistinctBatches(), 6);
  EXPECT_FALSE(loader->EntropyFloor().has_value());
}

TEST(DataLoaderTest, TwoRanksInterleaveAndTogetherEqualOneRankOfTwiceTheBatch) {
  const std::string path = WriteLlmc("two.bin", Iota(40));
  DataLoader rank0 = *DataLoader::Create(Files(path, path), Split::kTrain, 100, 2, 3, 0, 2, "data");
  DataLoader rank1 = *DataLoader::Create(Files(path, path), Split::kTrain, 100, 2, 3, 1, 2, "data");
  DataLoader single =
      *DataLoader::Create(Files(path, path), Split::kTrain, 100, 4, 3, 0, 1, "data");
  // Rank r starts at r*B*T and advances by B*T*W = 12; after 24, 36 + 13 > 40 starts over.
  EXPECT_THAT(Starts(rank0, 4), ::testing::ElementsAre(0, 12, 24, 0));
  EXPECT_THAT(Starts(rank1, 4), ::testing::ElementsAre(6, 18, 30, 6));  // together with rank 0
  EXPECT_EQ(rank1.DistinctBatches(), 3);
  rank0.Reset();
  rank1.Reset();
  for (int i = 0; i < 3; ++i) {
    const Batch a = rank0.Next().value(), b = rank1.Next().value(), whole = single.Next().value();
    EXPECT_TRUE(at::cat({a.inputs, b.inputs}).equal(whole.inputs)) << i;
    EXPECT_TRUE(at::cat({a.targets, b.targets}).equal(whole.targets)) << i;
  }
}

TEST(DataLoaderTest, ShuffledWindowsAreASeededPermutationPerPassAndRanksStayTogether) {
  // 40 tokens, B=2, T=3, W=2: windows of 12 tokens at 0, 12, 24 (a read needs 13).
  const std::string path = WriteLlmc("shuffle.bin", Iota(40));
  DataConfig data = Files(path, path);
  data.mutable_token_files()->set_shuffle(true);
  data.mutable_token_files()->set_shuffle_seed(3);
  DataLoader rank0 = *DataLoader::Create(data, Split::kTrain, 100, 2, 3, 0, 2, "data");
  DataLoader rank1 = *DataLoader::Create(data, Split::kTrain, 100, 2, 3, 1, 2, "data");
  DataLoader single = *DataLoader::Create(data, Split::kTrain, 100, 4, 3, 0, 1, "data");
  const std::vector<int64_t> starts = Starts(rank0, 6);
  std::vector<int64_t> first_pass(starts.begin(), starts.begin() + 3);
  std::vector<int64_t> second_pass(starts.begin() + 3, starts.end());
  EXPECT_THAT(first_pass, ::testing::UnorderedElementsAre(0, 12, 24));
  EXPECT_THAT(second_pass, ::testing::UnorderedElementsAre(0, 12, 24));
  EXPECT_THAT(Starts(rank1, 6), ::testing::Pointwise(::testing::Eq(), [&] {
                std::vector<int64_t> shifted;
                for (int64_t s : starts) shifted.push_back(s + 6);
                return shifted;
              }()));
  rank0.Reset();
  rank1.Reset();
  for (int i = 0; i < 4; ++i) {
    const Batch a = rank0.Next().value(), b = rank1.Next().value(), whole = single.Next().value();
    EXPECT_TRUE(at::cat({a.inputs, b.inputs}).equal(whole.inputs)) << i;
  }
  // Another seed, another order (for these three windows, over two passes).
  data.mutable_token_files()->set_shuffle_seed(4);
  DataLoader other = *DataLoader::Create(data, Split::kTrain, 100, 2, 3, 0, 2, "data");
  DataLoader eval = *DataLoader::Create(data, Split::kEval, 100, 2, 3, 0, 2, "data");
  EXPECT_NE(Starts(other, 6), starts);
  EXPECT_THAT(Starts(eval, 3), ::testing::ElementsAre(0, 12, 24));  // held out: in order
}

TEST(DataLoaderTest, ErrorsNameTheCallersFieldAndTheFile) {
  const std::string path = WriteLlmc("short.bin", Iota(12));
  EXPECT_THAT(DataLoader::Create(Files(path, path), Split::kTrain, 100, 2, 3, 0, 2, "cfg.data"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "cfg.data.token_files.train_path: " + path +
                           ": too short for one batch: 12 tokens; 2 ranks x micro_batch 2 x "
                           "seq_len 3 need 13"));
  const std::string bad = WriteLlmc("bad_eval.bin", Iota(40), 1234);
  EXPECT_THAT(DataLoader::Create(Files(path, bad), Split::kEval, 100, 1, 3, 0, 1, "cfg.data"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cfg.data.token_files.eval_path: " + bad + ": bad magic")));
  DataConfig synthetic = ResolvedDataConfig(DataConfig());
  synthetic.mutable_synthetic()->set_num_states(300);
  EXPECT_THAT(DataLoader::Create(synthetic, Split::kTrain, 256, 1, 3, 0, 1, "cfg.data"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cfg.data.synthetic.num_states: 300; must be in [2, "
                                 "vocab_size = 256]")));
}

// A token file truncated under a running job: Next says which field's file changed and how.
TEST(DataLoaderTest, NextNamesTheFieldAndTheFileWhenTheFileChanged) {
  for (const bool shuffle : {false, true}) {
    const std::string path = WriteLlmc("changing.bin", Iota(40));
    DataConfig data = Files(path, path);
    data.mutable_token_files()->set_shuffle(shuffle);
    absl::StatusOr<DataLoader> loader =
        DataLoader::Create(data, Split::kTrain, 100, 2, 3, 0, 1, "cfg.data");
    ASSERT_THAT(loader, IsOk());
    ASSERT_THAT(loader->Next(), IsOk());
    ASSERT_EQ(truncate(path.c_str(), 1024 + 2 * 10), 0);
    EXPECT_THAT(loader->Next(),
                StatusIs(absl::StatusCode::kDataLoss,
                         HasSubstr("cfg.data.token_files.train_path: " + path +
                                   ": the file changed after it was opened: it held 40 tokens "
                                   "(1104 bytes) when opened and now has 1044 bytes")))
        << (shuffle ? "shuffled" : "in order");
  }
}

TEST(DataLoaderTest, SyntheticRanksTogetherEqualOneRankAndEvalIsHeldOut) {
  const DataConfig data = ResolvedDataConfig(DataConfig());
  DataLoader rank0 = *DataLoader::Create(data, Split::kTrain, 4096, 2, 8, 0, 2, "data");
  DataLoader rank1 = *DataLoader::Create(data, Split::kTrain, 4096, 2, 8, 1, 2, "data");
  DataLoader single = *DataLoader::Create(data, Split::kTrain, 4096, 4, 8, 0, 1, "data");
  DataLoader eval = *DataLoader::Create(data, Split::kEval, 4096, 4, 8, 0, 1, "data");
  for (int i = 0; i < 3; ++i) {
    const Batch a = rank0.Next().value(), b = rank1.Next().value(), whole = single.Next().value();
    EXPECT_TRUE(at::cat({a.inputs, b.inputs}).equal(whole.inputs)) << i;
    EXPECT_TRUE(whole.inputs.narrow(1, 1, 7).equal(whole.targets.narrow(1, 0, 7)));
  }
  single.Reset();
  const Batch held_out = eval.Next().value();
  EXPECT_FALSE(held_out.inputs.equal(single.Next().value().inputs));
  eval.Reset();
  EXPECT_TRUE(eval.Next().value().inputs.equal(held_out.inputs));
  ASSERT_TRUE(eval.EntropyFloor().has_value());
  EXPECT_GT(*eval.EntropyFloor(), 0.0);
  EXPECT_EQ(eval.DistinctBatches(), std::nullopt);
}

// Seek(n) reads what n calls of Next would have left next: sequential and shuffled files
// (across passes: 3 world batches per pass here) and the synthetic source, on 1 and 2 ranks.
TEST(DataLoaderTest, SeekContinuesWhereThatManyBatchesWouldHaveLeftOff) {
  const std::string path = WriteLlmc("seek.bin", Iota(40));
  DataConfig shuffled = Files(path, path);
  shuffled.mutable_token_files()->set_shuffle(true);
  shuffled.mutable_token_files()->set_shuffle_seed(5);
  const std::vector<std::pair<const char*, DataConfig>> sources = {
      {"sequential", Files(path, path)},
      {"shuffled", shuffled},
      {"synthetic", ResolvedDataConfig({})}};
  for (const auto& [name, data] : sources) {
    for (const int world : {1, 2}) {
      const int rank = world - 1;
      DataLoader straight =
          *DataLoader::Create(data, Split::kTrain, 100, 2, 3, rank, world, "data");
      std::vector<at::Tensor> inputs;
      for (int i = 0; i < 12; ++i) inputs.push_back(straight.Next().value().inputs);
      for (int skip = 0; skip < 9; ++skip) {
        DataLoader resumed =
            *DataLoader::Create(data, Split::kTrain, 100, 2, 3, rank, world, "data");
        // Seek starts from the beginning whatever was read before.
        ASSERT_THAT(resumed.Next(), IsOk());
        resumed.Seek(skip);
        for (int i = skip; i < 12; ++i) {
          EXPECT_TRUE(resumed.Next().value().inputs.equal(inputs[i]))
              << name << ", " << world << " ranks, seek " << skip << ", batch " << i;
        }
      }
    }
  }
}

// A preference file of `n` pairs whose prompt is [i] for pair i.
std::string PairFile(int n) {
  std::string text;
  for (int i = 0; i < n; ++i) {
    text += "{\"prompt\": [" + std::to_string(i) + "], \"chosen\": [1], \"rejected\": [2]}\n";
  }
  const std::string path = base::testing::TestPath("pairs.jsonl");
  EXPECT_THAT(base::WriteFileAtomically(path, text), IsOk());
  return path;
}

// The prompts of the next micro-batch's chosen rows.
std::vector<int64_t> Prompts(DataLoader& loader) {
  const Batch batch = loader.Next().value();
  EXPECT_EQ(batch.inputs.size(0) % 2, 0);
  std::vector<int64_t> prompts;
  for (int64_t r = 0; r < batch.inputs.size(0) / 2; ++r) {
    prompts.push_back(batch.inputs[r][0].item<int64_t>());
  }
  return prompts;
}

// Rank r of W takes the r-th B pairs of each W*B window, and the world starts over together.
TEST(DataLoaderTest, PreferenceFilesFollowLlmcsRankPattern) {
  DataConfig data;
  data.mutable_preference_files()->set_train_path(PairFile(10));
  data.mutable_preference_files()->set_eval_path(PairFile(10));
  auto rank1 = DataLoader::Create(data, Split::kTrain, 100, 2, 4, 1, 2, "plan.data");
  ASSERT_THAT(rank1, IsOk());
  EXPECT_EQ(rank1->DistinctBatches(), 2);
  EXPECT_THAT(Prompts(*rank1), ::testing::ElementsAre(2, 3));
  EXPECT_THAT(Prompts(*rank1), ::testing::ElementsAre(6, 7));
  EXPECT_THAT(Prompts(*rank1), ::testing::ElementsAre(2, 3));
  rank1->Seek(3);
  EXPECT_THAT(Prompts(*rank1), ::testing::ElementsAre(6, 7));
  // Shuffled: each pass a permutation of the file, resumable by Seek.
  data.mutable_preference_files()->set_shuffle(true);
  auto shuffled = DataLoader::Create(data, Split::kTrain, 100, 5, 4, 0, 1, "plan.data");
  ASSERT_THAT(shuffled, IsOk());
  std::vector<int64_t> pass = Prompts(*shuffled);
  const std::vector<int64_t> second_half = Prompts(*shuffled);
  pass.insert(pass.end(), second_half.begin(), second_half.end());
  const std::vector<int64_t> third = Prompts(*shuffled);
  std::sort(pass.begin(), pass.end());
  EXPECT_THAT(pass, ::testing::ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));
  shuffled->Seek(2);
  EXPECT_EQ(Prompts(*shuffled), third);
}

TEST(DataLoaderTest, PairFileErrorsNameTheField) {
  DataConfig data;
  data.mutable_preference_files()->set_train_path(PairFile(3));
  EXPECT_THAT(DataLoader::Create(data, Split::kTrain, 100, 2, 4, 0, 2, "plan.data"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("plan.data.preference_files.train_path: ")));
  EXPECT_THAT(DataLoader::Create(data, Split::kTrain, 1, 1, 4, 0, 1, "plan.data"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("plan.data.preference_files.train_path: ")));
}

// An SFT file whose example i has the prompt [10 + i] and a completion of lengths[i] - 1
// tokens, each 50 + i: its sequence takes lengths[i] tokens.
std::string SftFile(const std::string& name, const std::vector<int64_t>& lengths) {
  std::string text;
  for (size_t i = 0; i < lengths.size(); ++i) {
    std::vector<std::string> completion(lengths[i] - 1, std::to_string(50 + i));
    text += absl::StrCat("{\"prompt\": [", 10 + i, "], \"completion\": [",
                         absl::StrJoin(completion, ", "), "]}\n");
  }
  const std::string path = base::testing::TestPath(name);
  EXPECT_THAT(base::WriteFileAtomically(path, text), IsOk());
  return path;
}

// Packed SFT rows are best-fit-decreasing rows of whole examples, each sequence scored and
// positioned as alone in a padded row, read in the pattern of unpacked examples (a row for an
// example) on every rank, and resumable.
TEST(DataLoaderTest, PackedSftFilesReadBestFitRowsOfWholeExamples) {
  // Lengths 3, 5, 2, 4, 6 into rows of 7: {6}, {5, 2}, {4, 3}.
  DataConfig data;
  PairFiles* files = data.mutable_sft_files();
  files->set_train_path(SftFile("packed.jsonl", {3, 5, 2, 4, 6}));
  files->set_eval_path(files->train_path());
  files->set_packing(PACKING_BFD);
  auto loader = DataLoader::Create(data, Split::kTrain, 100, 1, 7, 0, 1, "plan.data");
  ASSERT_THAT(loader, IsOk());
  EXPECT_EQ(loader->DistinctBatches(), 3);
  // 20 tokens: 15 of 35 padded one to a row, 1 of 21 packed; in micro-batches of one
  // example, padding-free packs nothing.
  ASSERT_TRUE(loader->Packing().has_value());
  EXPECT_EQ(loader->Packing()->sequences, 5);
  EXPECT_EQ(loader->Packing()->bfd_rows, 3);
  EXPECT_NEAR(loader->Packing()->padded_padding, 15.0 / 35, 1e-12);
  EXPECT_NEAR(loader->Packing()->bfd_padding, 1.0 / 21, 1e-12);
  EXPECT_EQ(loader->Packing()->padding_free_rows, 5);
  EXPECT_EQ(DescribePacking(*loader->Packing(), PACKING_BFD, 7),
            "5 sequences in 3 rows of 7 tokens (PACKING_BFD), 4.8% padding; one sequence a row: "
            "5 rows, 42.9% padding; PACKING_PADDING_FREE: 5 rows, 42.9% padding");
  const Batch first = loader->Next().value();
  // The first row's tail is padding that scores nothing, positioned as its last sequence.
  EXPECT_TRUE(first.inputs.equal(torch::tensor({{14, 54, 54, 54, 54, 54, 0}}, at::kLong)))
      << first.inputs;
  const std::vector<int64_t> targets = {54, 54, 54, 54, 54, kIgnoreTarget, kIgnoreTarget};
  EXPECT_TRUE(first.targets.equal(torch::tensor(targets).view({1, 7}))) << first.targets;
  EXPECT_TRUE(first.positions.equal(torch::tensor({{0, 1, 2, 3, 4, 5, 6}}, at::kLong)));
  const Batch second = loader->Next().value();
  EXPECT_TRUE(second.inputs.equal(torch::tensor({{11, 51, 51, 51, 51, 12, 52}}, at::kLong)));
  EXPECT_TRUE(second.positions.equal(torch::tensor({{0, 1, 2, 3, 4, 0, 1}}, at::kLong)));
  const Batch third = loader->Next().value();
  EXPECT_TRUE(third.inputs.equal(torch::tensor({{13, 53, 53, 53, 10, 50, 50}}, at::kLong)));
  EXPECT_TRUE(third.positions.equal(torch::tensor({{0, 1, 2, 3, 0, 1, 2}}, at::kLong)));
  loader->Seek(1);
  EXPECT_TRUE(loader->Next().value().inputs.equal(second.inputs));
  // Rank 1 of 3 reads the second row.
  auto rank1 = DataLoader::Create(data, Split::kTrain, 100, 1, 7, 1, 3, "plan.data");
  ASSERT_THAT(rank1, IsOk());
  EXPECT_TRUE(rank1->Next().value().inputs.equal(second.inputs));
  // A world batch needs as many rows: 4 ranks would need 4.
  EXPECT_THAT(DataLoader::Create(data, Split::kTrain, 100, 1, 7, 0, 4, "plan.data"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("too few packed rows for one batch: 3")));
}

// Padding-free micro-batches read the examples of unpacked ones and place their sequences in
// order: a preference micro-batch's chosen, then its rejected sequences, each into the current
// row when it fits.
TEST(DataLoaderTest, PaddingFreePreferenceMicroBatchesPlaceTheirSequencesInOrder) {
  std::string text;
  for (int i = 0; i < 4; ++i) {
    // Chosen of 2 + i tokens after the 1-token prompt, rejected of 1.
    std::vector<std::string> chosen(2 + i, std::to_string(50 + i));
    text += absl::StrCat("{\"prompt\": [", 10 + i, "], \"chosen\": [", absl::StrJoin(chosen, ", "),
                         "], \"rejected\": [", 60 + i, "]}\n");
  }
  DataConfig data;
  PairFiles* files = data.mutable_preference_files();
  files->set_train_path(base::testing::TestPath("padding_free.jsonl"));
  ASSERT_THAT(base::WriteFileAtomically(files->train_path(), text), IsOk());
  files->set_eval_path(files->train_path());
  files->set_packing(PACKING_PADDING_FREE);
  auto loader = DataLoader::Create(data, Split::kTrain, 100, 2, 8, 0, 1, "plan.data");
  ASSERT_THAT(loader, IsOk());
  // Sequences of 3 and 4 tokens (chosen), 2 and 2 (rejected): rows {3, 4}, {2, 2}.
  const Batch batch = loader->Next().value();
  EXPECT_TRUE(batch.inputs.equal(
      torch::tensor({{10, 50, 50, 11, 51, 51, 51, 0}, {10, 60, 11, 61, 0, 0, 0, 0}}, at::kLong)))
      << batch.inputs;
  EXPECT_TRUE(batch.positions.equal(
      torch::tensor({{0, 1, 2, 0, 1, 2, 3, 4}, {0, 1, 0, 1, 2, 3, 4, 5}}, at::kLong)))
      << batch.positions;
  const std::vector<int64_t> targets = {50,
                                        50,
                                        kIgnoreTarget,
                                        51,
                                        51,
                                        51,
                                        kIgnoreTarget,
                                        kIgnoreTarget,
                                        60,
                                        kIgnoreTarget,
                                        61,
                                        kIgnoreTarget,
                                        kIgnoreTarget,
                                        kIgnoreTarget,
                                        kIgnoreTarget,
                                        kIgnoreTarget};
  EXPECT_TRUE(batch.targets.equal(torch::tensor(targets).view({2, 8}))) << batch.targets;
  // The next micro-batch holds the next two pairs: 5 + 6 tokens need two rows, the rejected
  // sequences a third.
  EXPECT_EQ(loader->Next().value().inputs.size(0), 3);
  EXPECT_EQ(loader->Packing()->padding_free_rows, 5);
  EXPECT_EQ(loader->Packing()->bfd_rows, 0);
  // Best fit over the whole file would split pairs across micro-batches: refused.
  files->set_packing(PACKING_BFD);
  EXPECT_THAT(CheckDataConfig(data, 100, "plan.data"),
              ::testing::ElementsAre(
                  ::testing::Field(&base::Violation::field, "plan.data.preference_files.packing")));
}

TEST(DataLoaderTest, DocumentStartTokenRestartsPositions) {
  // Token i is i % 5, so every fifth token (0) starts a document.
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back(i % 5);
  const std::string path = WriteLlmc("documents.bin", tokens);
  DataConfig data = Files(path, path);
  EXPECT_FALSE(DataLoader::Create(data, Split::kTrain, 100, 2, 3, 0, 1, "data")
                   ->Next()
                   ->positions.defined());
  data.mutable_token_files()->set_document_start_token(0);
  const Batch batch =
      DataLoader::Create(data, Split::kTrain, 100, 2, 4, 0, 1, "data")->Next().value();
  // Rows [0 1 2 3] and [4 0 1 2]: the second row's first token starts a sequence too.
  EXPECT_TRUE(batch.positions.equal(torch::tensor({{0, 1, 2, 3}, {0, 0, 1, 2}}, at::kLong)))
      << batch.positions;
}

// Text examples are tokenized with the tokenizer the config names (text_pairs_test.cc checks
// the ids); one whose ids do not fit the model's vocabulary is an error at its field.
TEST(DataLoaderTest, TextSftFilesAreTokenizedWithTheNamedTokenizer) {
  const std::string path = base::testing::TestPath("sft_text.jsonl");
  ASSERT_THAT(base::WriteFileAtomically(path,
                                        "{\"prompt\": \"2 + 2 =\", \"completion\": \" 4\"}\n"
                                        "{\"prompt\": \"Hello\", \"completion\": \" world\"}\n"),
              IsOk());
  DataConfig data;
  PairFiles& files = *data.mutable_sft_files();
  files.set_train_path(path);
  files.set_format(PAIR_FORMAT_TEXT);
  files.set_tokenizer("data/tokenizer/testdata/tiny");
  auto loader = DataLoader::Create(data, Split::kTrain, 1000, 2, 16, 0, 1, "plan.data");
  ASSERT_THAT(loader, IsOk());
  const Batch batch = loader->Next().value();
  // The tiny tokenizer's BOS (0) starts each row; the completions end with its EOS (1).
  EXPECT_EQ(batch.inputs[0][0].item<int64_t>(), 0);
  EXPECT_EQ(batch.inputs[1][0].item<int64_t>(), 0);
  EXPECT_EQ((batch.targets == 1).sum().item<int64_t>(), 2);
  EXPECT_THAT(DataLoader::Create(data, Split::kTrain, 999, 2, 16, 0, 1, "plan.data"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("plan.data.sft_files.tokenizer: data/tokenizer/testdata/tiny: "
                                 "its ids reach 999, beyond the model's vocab_size 999")));
  files.set_tokenizer(base::testing::TestPath("none"));
  EXPECT_THAT(DataLoader::Create(data, Split::kTrain, 1000, 2, 16, 0, 1, "plan.data"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("plan.data.sft_files.tokenizer: ")));
  files.set_tokenizer("data/tokenizer/testdata/tiny");
  ASSERT_THAT(base::WriteFileAtomically(path, "{\"prompt\": \"a\", \"completion\": \"\"}\n"),
              IsOk());
  EXPECT_THAT(
      DataLoader::Create(data, Split::kTrain, 1000, 1, 16, 0, 1, "plan.data"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("plan.data.sft_files.train_path: " + path + ":1: completion: is empty")));
}

TEST(DataLoaderTest, SyntheticPairsMaskTheirPromptsAndDifferInTheirCompletions) {
  DataConfig data;
  data.mutable_synthetic_pairs()->set_prompt_length(3);
  data.mutable_synthetic_pairs()->set_rejected_seed(1);
  auto loader =
      DataLoader::Create(ResolvedDataConfig(data), Split::kTrain, 256, 2, 8, 0, 1, "plan.data");
  ASSERT_THAT(loader, IsOk());
  const Batch batch = loader->Next().value();
  ASSERT_EQ(batch.inputs.size(0), 4);
  // Same prompts, different completions; prompt targets are not scored.
  EXPECT_TRUE(batch.inputs[0].narrow(0, 0, 3).equal(batch.inputs[2].narrow(0, 0, 3)));
  EXPECT_FALSE(batch.inputs[0].equal(batch.inputs[2]));
  EXPECT_EQ(batch.targets[0][1].item<int64_t>(), kIgnoreTarget);
  EXPECT_EQ(batch.targets[0][2].item<int64_t>(), batch.inputs[0][3].item<int64_t>());
  EXPECT_FALSE(loader->EntropyFloor().has_value());
}

// Synthetic SFT examples: a prompt and its chain's continuation, one row each; the prompt's
// targets (all positions before the first completion token) carry no loss, every completion
// token does, and the loss floor is the chain's entropy rate.
TEST(DataLoaderTest, SyntheticSftScoresTheCompletionOfEachPromptOnly) {
  DataConfig data;
  data.mutable_synthetic_sft()->set_prompt_length(3);
  const DataConfig resolved = ResolvedDataConfig(data);
  auto loader = DataLoader::Create(resolved, Split::kTrain, 256, 2, 8, 0, 1, "plan.data");
  ASSERT_THAT(loader, IsOk());
  const Batch batch = loader->Next().value();
  ASSERT_EQ(batch.inputs.size(0), 2);
  for (int64_t row = 0; row < 2; ++row) {
    for (int64_t t = 0; t < 2; ++t) {
      EXPECT_EQ(batch.targets[row][t].item<int64_t>(), kIgnoreTarget) << row << ", " << t;
    }
    for (int64_t t = 2; t < 7; ++t) {
      EXPECT_EQ(batch.targets[row][t].item<int64_t>(), batch.inputs[row][t + 1].item<int64_t>())
          << row << ", " << t;
    }
    EXPECT_EQ(batch.targets[row][7].item<int64_t>(), kIgnoreTarget);
  }
  // The loss floor of the completions is the chain's, as for the synthetic source.
  DataConfig plain;
  *plain.mutable_synthetic() = resolved.synthetic_sft().chain();
  auto chain = DataLoader::Create(plain, Split::kTrain, 256, 2, 7, 0, 1, "plan.data");
  ASSERT_THAT(chain, IsOk());
  ASSERT_TRUE(chain->EntropyFloor().has_value());
  EXPECT_EQ(loader->EntropyFloor(), chain->EntropyFloor());
}

}  // namespace
}  // namespace plait::data
