#include "data/data_config.h"

#include "gtest/gtest.h"

namespace plait::data {
namespace {

TEST(ResolvedDataConfigTest, NoSourceIsTheDefaultSyntheticSource) {
  const DataConfig data = ResolvedDataConfig(DataConfig());
  ASSERT_TRUE(data.has_synthetic());
  EXPECT_EQ(data.synthetic().seed(), 0u);
  EXPECT_EQ(data.synthetic().num_states(), kDefaultNumStates);
  EXPECT_EQ(data.synthetic().branching(), kDefaultBranching);
  EXPECT_EQ(data.synthetic().peak(), kDefaultPeak);
}

TEST(ResolvedDataConfigTest, SetValuesAndTokenFilesAreKept) {
  DataConfig synthetic;
  synthetic.mutable_synthetic()->set_seed(7);
  synthetic.mutable_synthetic()->set_branching(2);
  const DataConfig resolved = ResolvedDataConfig(synthetic);
  EXPECT_EQ(resolved.synthetic().seed(), 7u);
  EXPECT_EQ(resolved.synthetic().branching(), 2);
  EXPECT_EQ(resolved.synthetic().num_states(), kDefaultNumStates);

  DataConfig files;
  files.mutable_token_files()->set_train_path("train.bin");
  files.mutable_token_files()->set_format(TOKEN_FORMAT_LLMC);
  EXPECT_EQ(ResolvedDataConfig(files).ShortDebugString(), files.ShortDebugString());
}

}  // namespace
}  // namespace plait::data
