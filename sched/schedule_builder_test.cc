#include "sched/schedule_builder.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace plait::sched {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::HasSubstr;

constexpr double kPi = 3.14159265358979323846;

ScheduleConfig ParseConfig(const std::string& text) {
  ScheduleConfig config;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &config)) << text;
  return config;
}

// Hugging Face's lr lambdas (transformers/optimization.py), transcribed step for step so
// the builder is checked against the formulas users know rather than against itself.
// Each returns the multiplier of the peak lr at `s` for warmup `w` and run length `n`.
double HfWarmup(int64_t s, int64_t w) {
  return static_cast<double>(s) / static_cast<double>(std::max<int64_t>(1, w));
}

double HfProgress(int64_t s, int64_t w, int64_t n) {
  return static_cast<double>(s - w) / static_cast<double>(std::max<int64_t>(1, n - w));
}

double HfLinear(int64_t s, int64_t w, int64_t n) {
  if (s < w) return HfWarmup(s, w);
  return std::max(0.0,
                  static_cast<double>(n - s) / static_cast<double>(std::max<int64_t>(1, n - w)));
}

double HfCosine(int64_t s, int64_t w, int64_t n, double cycles) {
  if (s < w) return HfWarmup(s, w);
  return std::max(0.0, 0.5 * (1.0 + std::cos(kPi * cycles * 2.0 * HfProgress(s, w, n))));
}

double HfCosineWithHardRestarts(int64_t s, int64_t w, int64_t n, double cycles) {
  if (s < w) return HfWarmup(s, w);
  const double progress = HfProgress(s, w, n);
  if (progress >= 1.0) return 0.0;
  return std::max(0.0, 0.5 * (1.0 + std::cos(kPi * std::fmod(cycles * progress, 1.0))));
}

double HfCosineWithMinLr(int64_t s, int64_t w, int64_t n, double cycles, double min_rate) {
  if (s < w) return HfWarmup(s, w);
  const double factor = 0.5 * (1.0 + std::cos(kPi * cycles * 2.0 * HfProgress(s, w, n)));
  return std::max(0.0, factor * (1.0 - min_rate) + min_rate);
}

double HfPolynomial(int64_t s, int64_t w, int64_t n, double lr_init, double lr_end, double power) {
  if (s < w) return HfWarmup(s, w);
  if (s > n) return lr_end / lr_init;
  const double pct_remaining = 1.0 - static_cast<double>(s - w) / static_cast<double>(n - w);
  return ((lr_init - lr_end) * std::pow(pct_remaining, power) + lr_end) / lr_init;
}

double HfInverseSqrt(int64_t s, int64_t w, int64_t timescale) {
  if (s < w) return HfWarmup(s, w);
  const int64_t shift = timescale - w;
  return 1.0 / std::sqrt(static_cast<double>(s + shift) / static_cast<double>(timescale));
}

double HfWarmupStableDecay(int64_t s, int64_t w, int64_t stable, int64_t decay,
                           const std::string& decay_type, double min_ratio, double cycles) {
  if (s < w) {
    const double factor = HfWarmup(s, w);  // warmup_type "linear"
    return std::max(0.0, factor * (1.0 - min_ratio) + min_ratio);
  }
  if (s < w + stable) return 1.0;
  if (s < w + stable + decay) {
    const double progress =
        static_cast<double>(s - w - stable) / static_cast<double>(std::max<int64_t>(1, decay));
    double factor = 0.0;
    if (decay_type == "linear") factor = 1.0 - progress;
    if (decay_type == "cosine") factor = 0.5 * (1.0 + std::cos(kPi * cycles * 2.0 * progress));
    if (decay_type == "1-sqrt") factor = 1.0 - std::sqrt(progress);
    return std::max(0.0, factor * (1.0 - min_ratio) + min_ratio);
  }
  return min_ratio;
}

struct HfCase {
  std::string name;
  std::string config;
  std::function<double(int64_t)> reference;
  // Steps checked: [0, last_checked]. HF's cosine formulas turn back up past the run,
  // where plait holds the final value, so those are compared within the run.
  int64_t last_checked;
};

class MatchesHuggingFaceTest : public ::testing::TestWithParam<HfCase> {};

TEST_P(MatchesHuggingFaceTest, AtEveryStep) {
  const HfCase& test_case = GetParam();
  absl::StatusOr<Schedule> schedule = BuildSchedule(ParseConfig(test_case.config));
  ASSERT_THAT(schedule, IsOk());
  for (int64_t step = 0; step <= test_case.last_checked; ++step) {
    ASSERT_NEAR(schedule->Multiplier(step), test_case.reference(step), 1e-12) << "step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, MatchesHuggingFaceTest,
    ::testing::Values(
        HfCase{"constant", "lr: 0.1 total_steps: 100 constant {}", [](int64_t) { return 1.0; },
               200},
        HfCase{"constant_with_warmup",
               "lr: 0.1 total_steps: 100 warmup { steps: 7 } constant_with_warmup {}",
               [](int64_t s) { return s < 7 ? HfWarmup(s, 7) : 1.0; }, 200},
        HfCase{"linear", "lr: 0.1 total_steps: 100 warmup { steps: 10 } linear {}",
               [](int64_t s) { return HfLinear(s, 10, 100); }, 200},
        HfCase{"linear_warmup_ratio", "lr: 0.1 total_steps: 95 warmup { ratio: 0.1 } linear {}",
               [](int64_t s) { return HfLinear(s, 10, 95); }, 200},  // ceil(9.5)
        HfCase{"cosine", "lr: 0.1 total_steps: 100 warmup { steps: 10 } cosine {}",
               [](int64_t s) { return HfCosine(s, 10, 100, 0.5); }, 100},
        HfCase{"cosine_no_warmup", "lr: 3e-4 total_steps: 1000 cosine {}",
               [](int64_t s) { return HfCosine(s, 0, 1000, 0.5); }, 1000},
        HfCase{"cosine_with_restarts",
               "lr: 0.1 total_steps: 130 warmup { steps: 10 } "
               "cosine_with_restarts { num_cycles: 3 }",
               [](int64_t s) { return HfCosineWithHardRestarts(s, 10, 130, 3.0); }, 300},
        HfCase{"cosine_with_min_lr_rate",
               "lr: 0.1 total_steps: 100 warmup { steps: 10 } "
               "cosine_with_min_lr { min_lr_rate: 0.1 }",
               [](int64_t s) { return HfCosineWithMinLr(s, 10, 100, 0.5, 0.1); }, 100},
        HfCase{"cosine_with_min_lr",
               "lr: 0.2 total_steps: 100 warmup { steps: 10 } "
               "cosine_with_min_lr { min_lr: 0.05 }",
               [](int64_t s) { return HfCosineWithMinLr(s, 10, 100, 0.5, 0.25); }, 100},
        HfCase{"polynomial",
               "lr: 0.1 total_steps: 100 warmup { steps: 10 } "
               "polynomial { power: 2 lr_end: 0.001 }",
               [](int64_t s) { return HfPolynomial(s, 10, 100, 0.1, 0.001, 2.0); }, 300},
        HfCase{"polynomial_defaults", "lr: 0.1 total_steps: 100 warmup { steps: 10 } polynomial {}",
               [](int64_t s) { return HfPolynomial(s, 10, 100, 0.1, 1e-7, 1.0); }, 300},
        HfCase{"inverse_sqrt", "lr: 0.1 total_steps: 1000 warmup { steps: 50 } inverse_sqrt {}",
               [](int64_t s) { return HfInverseSqrt(s, 50, 50); }, 3000},
        HfCase{"inverse_sqrt_timescale",
               "lr: 0.1 total_steps: 1000 warmup { steps: 50 } inverse_sqrt { timescale: 200 }",
               [](int64_t s) { return HfInverseSqrt(s, 50, 200); }, 3000},
        HfCase{"inverse_sqrt_no_warmup", "lr: 0.1 total_steps: 1000 inverse_sqrt {}",
               [](int64_t s) { return HfInverseSqrt(s, 0, 10000); }, 3000},
        HfCase{"wsd_cosine",
               "lr: 0.1 total_steps: 100 warmup { steps: 10 } "
               "warmup_stable_decay { decay_steps: 20 min_lr_ratio: 0.1 }",
               [](int64_t s) { return HfWarmupStableDecay(s, 10, 70, 20, "cosine", 0.1, 0.5); },
               300},
        HfCase{"wsd_linear",
               "lr: 0.1 total_steps: 100 warmup { steps: 10 } "
               "warmup_stable_decay { stable_steps: 60 decay_shape: SHAPE_LINEAR }",
               [](int64_t s) { return HfWarmupStableDecay(s, 10, 60, 30, "linear", 0.0, 0.5); },
               300},
        HfCase{"wsd_one_minus_sqrt_ratios",
               "lr: 0.1 total_steps: 200 warmup { ratio: 0.05 } "
               "warmup_stable_decay { stable_ratio: 0.5 decay_ratio: 0.25 "
               "decay_shape: SHAPE_ONE_MINUS_SQRT min_lr_ratio: 0.05 }",
               [](int64_t s) { return HfWarmupStableDecay(s, 10, 100, 50, "1-sqrt", 0.05, 0.5); },
               400}),
    [](const ::testing::TestParamInfo<HfCase>& info) { return info.param.name; });

TEST(BuildScheduleTest, PyTorchStyleDecaysCountFromTheEndOfWarmup) {
  absl::StatusOr<Schedule> step = BuildSchedule(
      ParseConfig("lr: 1 total_steps: 100 warmup { steps: 5 } step { step_size: 10 gamma: 0.5 }"));
  ASSERT_THAT(step, IsOk());
  EXPECT_DOUBLE_EQ(step->LearningRate(14), 1.0);
  EXPECT_DOUBLE_EQ(step->LearningRate(15), 0.5);

  absl::StatusOr<Schedule> multistep = BuildSchedule(
      ParseConfig("lr: 1 total_steps: 100 multistep { milestones: [10, 20] gamma: 0.1 }"));
  ASSERT_THAT(multistep, IsOk());
  EXPECT_DOUBLE_EQ(multistep->LearningRate(9), 1.0);
  EXPECT_NEAR(multistep->LearningRate(25), 0.01, 1e-15);

  absl::StatusOr<Schedule> exponential =
      BuildSchedule(ParseConfig("lr: 2 total_steps: 100 exponential { gamma: 0.5 }"));
  ASSERT_THAT(exponential, IsOk());
  EXPECT_DOUBLE_EQ(exponential->LearningRate(3), 0.25);
}

TEST(BuildScheduleTest, WarmupShapeAndConvention) {
  absl::StatusOr<Schedule> schedule = BuildSchedule(ParseConfig(
      "lr: 1 total_steps: 100 "
      "warmup { steps: 4 shape: SHAPE_COSINE convention: WARMUP_SKIPS_ZERO } linear {}"));
  ASSERT_THAT(schedule, IsOk());
  EXPECT_NEAR(schedule->LearningRate(1), 0.5, 1e-12);  // p = 2/4
  EXPECT_NEAR(schedule->LearningRate(3), 1.0, 1e-12);
}

struct InvalidCase {
  std::string name;
  std::string config;
  std::string message;
};

class InvalidConfigTest : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(InvalidConfigTest, NamesTheFieldAndValue) {
  EXPECT_THAT(BuildSchedule(ParseConfig(GetParam().config), "plan.schedule"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(GetParam().message)));
}

INSTANTIATE_TEST_SUITE_P(
    Errors, InvalidConfigTest,
    ::testing::Values(
        InvalidCase{"no_schedule", "lr: 1 total_steps: 10",
                    "plan.schedule.decay: no schedule is set; set one of constant, "
                    "constant_with_warmup, linear"},
        InvalidCase{"zero_lr", "total_steps: 10 linear {}", "plan.schedule.lr: 0 must be > 0"},
        InvalidCase{"negative_lr", "lr: -0.1 total_steps: 10 linear {}",
                    "plan.schedule.lr: -0.1 must be > 0"},
        InvalidCase{"infinite_lr", "lr: inf total_steps: 10 linear {}",
                    "plan.schedule.lr: inf must be finite"},
        InvalidCase{"zero_total_steps", "lr: 1 linear {}",
                    "plan.schedule.total_steps: 0 must be > 0"},
        InvalidCase{"negative_warmup", "lr: 1 total_steps: 10 warmup { steps: -1 } linear {}",
                    "plan.schedule.warmup.steps: -1 must be >= 0"},
        InvalidCase{"warmup_longer_than_run",
                    "lr: 1 total_steps: 1000 warmup { steps: 2000 } linear {}",
                    "plan.schedule.warmup.steps: 2000 is longer than the run "
                    "(plan.schedule.total_steps = 1000)"},
        InvalidCase{"warmup_ratio", "lr: 1 total_steps: 10 warmup { ratio: 1.5 } linear {}",
                    "plan.schedule.warmup.ratio: 1.5 must be in [0, 1]"},
        InvalidCase{"constant_with_a_warmup",
                    "lr: 1 total_steps: 10 warmup { steps: 2 } constant {}",
                    "plan.schedule.warmup.steps: 2 is a warmup, which `constant` does not "
                    "take"},
        InvalidCase{"cosine_cycles", "lr: 1 total_steps: 10 cosine { num_cycles: 0 }",
                    "plan.schedule.cosine.num_cycles: 0 must be > 0"},
        // Infinite cycles or power made every rate NaN; the plan check let them through.
        InvalidCase{"cosine_cycles_infinite", "lr: 1 total_steps: 10 cosine { num_cycles: inf }",
                    "plan.schedule.cosine.num_cycles: inf must be finite"},
        InvalidCase{"polynomial_power_infinite", "lr: 1 total_steps: 10 polynomial { power: inf }",
                    "plan.schedule.polynomial.power: inf must be finite"},
        InvalidCase{"restarts_cycles",
                    "lr: 1 total_steps: 10 cosine_with_restarts { num_cycles: -2 }",
                    "plan.schedule.cosine_with_restarts.num_cycles: -2 must be > 0"},
        InvalidCase{"min_lr_missing", "lr: 1 total_steps: 10 cosine_with_min_lr {}",
                    "plan.schedule.cosine_with_min_lr.min_lr or "
                    "plan.schedule.cosine_with_min_lr.min_lr_rate: one must be set"},
        InvalidCase{"min_lr_above_lr", "lr: 0.1 total_steps: 10 cosine_with_min_lr { min_lr: 0.2 }",
                    "plan.schedule.cosine_with_min_lr.min_lr: 0.2 must be in "
                    "[0, plan.schedule.lr = 0.1]"},
        InvalidCase{"min_lr_rate",
                    "lr: 0.1 total_steps: 10 cosine_with_min_lr { min_lr_rate: -0.5 }",
                    "plan.schedule.cosine_with_min_lr.min_lr_rate: -0.5 must be in [0, 1]"},
        InvalidCase{"polynomial_power", "lr: 1 total_steps: 10 polynomial { power: 0 }",
                    "plan.schedule.polynomial.power: 0 must be > 0"},
        InvalidCase{"polynomial_lr_end", "lr: 1 total_steps: 10 polynomial { lr_end: 2 }",
                    "plan.schedule.polynomial.lr_end: 2 must be in [0, plan.schedule.lr = 1]"},
        InvalidCase{"inverse_sqrt_timescale", "lr: 1 total_steps: 10 inverse_sqrt { timescale: 0 }",
                    "plan.schedule.inverse_sqrt.timescale: 0 must be > 0"},
        InvalidCase{"wsd_lengths_missing", "lr: 1 total_steps: 10 warmup_stable_decay {}",
                    "plan.schedule.warmup_stable_decay.stable_steps or "
                    "plan.schedule.warmup_stable_decay.decay_steps (or their _ratio): at "
                    "least one must be set"},
        InvalidCase{"wsd_too_long",
                    "lr: 1 total_steps: 100 warmup { steps: 10 } "
                    "warmup_stable_decay { stable_steps: 60 decay_steps: 40 }",
                    "warmup 10 + stable 60 + decay 40 is longer than the run "
                    "(plan.schedule.total_steps = 100)"},
        InvalidCase{"wsd_decay_longer_than_run",
                    "lr: 1 total_steps: 100 warmup_stable_decay { decay_steps: 101 }",
                    "plan.schedule.warmup_stable_decay.decay_steps: 101 is longer than the run"},
        InvalidCase{"wsd_ratio", "lr: 1 total_steps: 100 warmup_stable_decay { decay_ratio: -0.1 }",
                    "plan.schedule.warmup_stable_decay.decay_ratio: -0.1 must be in [0, 1]"},
        InvalidCase{"wsd_min_lr_ratio",
                    "lr: 1 total_steps: 100 "
                    "warmup_stable_decay { decay_steps: 10 min_lr_ratio: 1.5 }",
                    "plan.schedule.warmup_stable_decay.min_lr_ratio: 1.5 must be in [0, 1]"},
        InvalidCase{"step_size", "lr: 1 total_steps: 10 step { step_size: 0 gamma: 0.5 }",
                    "plan.schedule.step.step_size: 0 must be > 0"},
        InvalidCase{"step_gamma", "lr: 1 total_steps: 10 step { step_size: 2 gamma: 1.5 }",
                    "plan.schedule.step.gamma: 1.5 must be in (0, 1]"},
        InvalidCase{"multistep_order",
                    "lr: 1 total_steps: 10 multistep { milestones: [5, 5] gamma: 0.5 }",
                    "plan.schedule.multistep.milestones[1]: 5 must be greater than the "
                    "milestone before it (5)"},
        InvalidCase{"multistep_negative",
                    "lr: 1 total_steps: 10 multistep { milestones: [-1] gamma: 0.5 }",
                    "plan.schedule.multistep.milestones[0]: -1 must be > 0"},
        InvalidCase{"exponential_gamma", "lr: 1 total_steps: 10 exponential { gamma: 0 }",
                    "plan.schedule.exponential.gamma: 0 must be in (0, 1]"}),
    [](const ::testing::TestParamInfo<InvalidCase>& info) { return info.param.name; });

TEST(BuildScheduleTest, DefaultFieldPathIsSchedule) {
  EXPECT_THAT(BuildSchedule(ParseConfig("lr: 1 linear {}")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("schedule.total_steps: 0 must be > 0")));
}

}  // namespace
}  // namespace plait::sched
