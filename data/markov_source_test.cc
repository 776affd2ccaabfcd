#include "data/markov_source.h"

#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "ATen/core/Tensor.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::data {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::HasSubstr;

SyntheticData Config(int64_t states, int64_t branching, double peak) {
  SyntheticData config;
  config.set_seed(5);
  config.set_num_states(states);
  config.set_branching(branching);
  config.set_peak(peak);
  return config;
}

TEST(MarkovSourceTest, EntropyRateHasItsClosedForm) {
  EXPECT_NEAR(MarkovSource::Create(Config(16, 1, 2.0), 100, "data.synthetic")->EntropyRate(), 0.0,
              1e-12);
  EXPECT_NEAR(MarkovSource::Create(Config(16, 4, 1.0), 100, "data.synthetic")->EntropyRate(),
              std::log(4.0), 1e-12);
  // Weights 1, 1/2: p = 2/3, 1/3.
  EXPECT_NEAR(MarkovSource::Create(Config(16, 2, 2.0), 100, "data.synthetic")->EntropyRate(),
              -(2.0 / 3) * std::log(2.0 / 3) - (1.0 / 3) * std::log(1.0 / 3), 1e-12);
}

TEST(MarkovSourceTest, SequencesAreDeterministicAndFollowTheChain) {
  absl::StatusOr<MarkovSource> source =
      MarkovSource::Create(Config(8, 2, 3.0), 1000, "data.synthetic");
  ASSERT_THAT(source, IsOk());
  const at::Tensor a = source->Sequences(0, 10, 4, 5000);
  EXPECT_TRUE(a.equal(source->Sequences(0, 10, 4, 5000)));
  EXPECT_TRUE(a.narrow(0, 1, 2).equal(source->Sequences(0, 11, 2, 5000)));
  EXPECT_FALSE(a.equal(source->Sequences(1, 10, 4, 5000)));
  // The empirical conditional entropy matches the rate, and there are 8 token ids.
  std::map<std::pair<int64_t, int64_t>, double> pairs;
  std::map<int64_t, double> firsts;
  std::set<int64_t> ids;
  const auto data = a.accessor<int64_t, 2>();
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t t = 0; t + 1 < 5000; ++t) {
      pairs[{data[i][t], data[i][t + 1]}] += 1;
      firsts[data[i][t]] += 1;
      ids.insert(data[i][t]);
    }
  }
  double entropy = 0.0, total = 0.0;
  for (const auto& [pair, n] : pairs) {
    entropy -= n * std::log(n / firsts[pair.first]);
    total += n;
  }
  EXPECT_EQ(ids.size(), 8u);
  EXPECT_NEAR(entropy / total, source->EntropyRate(), 0.02);
}

TEST(MarkovSourceTest, OutOfRangeValuesNameTheField) {
  EXPECT_THAT(
      MarkovSource::Create(Config(300, 2, 2.0), 256, "data.synthetic"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("data.synthetic.num_states: 300")));
  EXPECT_THAT(
      MarkovSource::Create(Config(8, 9, 2.0), 256, "data.synthetic"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("data.synthetic.branching: 9")));
  EXPECT_THAT(MarkovSource::Create(Config(8, 2, 0.5), 256, "data.synthetic"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("data.synthetic.peak: 0.5")));
}

}  // namespace
}  // namespace plait::data
