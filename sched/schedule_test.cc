#include "sched/schedule.h"

#include <cmath>
#include <cstdint>
#include <utility>

#include "gtest/gtest.h"

namespace plait::sched {
namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr double kTolerance = 1e-12;

// The largest change of the multiplier between consecutive steps in [from, to].
double LargestJump(const Schedule& schedule, int64_t from, int64_t to) {
  double largest = 0.0;
  for (int64_t step = from; step < to; ++step) {
    largest =
        std::max(largest, std::abs(schedule.Multiplier(step + 1) - schedule.Multiplier(step)));
  }
  return largest;
}

bool NonIncreasing(const Schedule& schedule, int64_t from, int64_t to) {
  for (int64_t step = from; step < to; ++step) {
    if (schedule.Multiplier(step + 1) > schedule.Multiplier(step) + kTolerance) return false;
  }
  return true;
}

TEST(WarmupTest, StartsAtZeroByDefaultAsHuggingFace) {
  const Schedule schedule(2.0, Warmup{.steps = 10}, ConstantDecay());
  EXPECT_DOUBLE_EQ(schedule.LearningRate(0), 0.0);
  EXPECT_DOUBLE_EQ(schedule.LearningRate(1), 0.2);
  EXPECT_DOUBLE_EQ(schedule.LearningRate(9), 1.8);   // warmup - 1
  EXPECT_DOUBLE_EQ(schedule.LearningRate(10), 2.0);  // warmup
}

TEST(WarmupTest, SkipsZeroReachesThePeakOneStepEarlier) {
  const Schedule schedule(2.0, Warmup{.steps = 10, .convention = Warmup::Convention::kSkipsZero},
                          ConstantDecay());
  EXPECT_DOUBLE_EQ(schedule.LearningRate(0), 0.2);
  EXPECT_DOUBLE_EQ(schedule.LearningRate(8), 1.8);
  EXPECT_DOUBLE_EQ(schedule.LearningRate(9), 2.0);
  EXPECT_DOUBLE_EQ(schedule.LearningRate(10), 2.0);
}

TEST(WarmupTest, ShapesAndStartFactor) {
  const Warmup cosine{.steps = 4, .shape = Shape::kCosine};
  EXPECT_NEAR(cosine.Multiplier(1), 0.5 * (1.0 - std::cos(kPi * 0.25)), kTolerance);
  EXPECT_NEAR(cosine.Multiplier(2), 0.5, kTolerance);
  const Warmup one_minus_sqrt{.steps = 4, .shape = Shape::kOneMinusSqrt};
  EXPECT_NEAR(one_minus_sqrt.Multiplier(3), 1.0 - std::sqrt(0.25), kTolerance);
  const Warmup floored{.steps = 4, .start_factor = 0.2};
  EXPECT_NEAR(floored.Multiplier(0), 0.2, kTolerance);
  EXPECT_NEAR(floored.Multiplier(2), 0.6, kTolerance);
}

TEST(ScheduleTest, NegativeStepsCountAsZero) {
  const Schedule schedule(1.0, Warmup{.steps = 10}, LinearDecay(90));
  EXPECT_EQ(schedule.LearningRate(-5), schedule.LearningRate(0));
}

TEST(LinearDecayTest, KeyStepsContinuityAndMonotonicity) {
  const Schedule schedule(1.0, Warmup{.steps = 10}, LinearDecay(90));
  EXPECT_NEAR(schedule.Multiplier(10), 1.0, kTolerance);
  EXPECT_NEAR(schedule.Multiplier(55), 0.5, kTolerance);
  EXPECT_NEAR(schedule.Multiplier(99), 1.0 / 90.0, kTolerance);  // last step
  EXPECT_NEAR(schedule.Multiplier(100), 0.0, kTolerance);
  EXPECT_NEAR(schedule.Multiplier(1000), 0.0, kTolerance);  // past the end
  EXPECT_LE(LargestJump(schedule, 0, 200), 0.1 + kTolerance);
  EXPECT_TRUE(NonIncreasing(schedule, 10, 200));
}

TEST(CosineDecayTest, HalfCycleFromPeakToFloor) {
  const Schedule schedule(1.0, Warmup{.steps = 10}, CosineDecay(100, 0.5, 0.1));
  EXPECT_NEAR(schedule.Multiplier(10), 1.0, kTolerance);
  EXPECT_NEAR(schedule.Multiplier(35), 0.1 + 0.9 * 0.5 * (1.0 + std::cos(kPi * 0.25)), kTolerance);
  EXPECT_NEAR(schedule.Multiplier(60), 0.55, kTolerance);
  EXPECT_NEAR(schedule.Multiplier(110), 0.1, kTolerance);
  // Past the end the value holds (HF's formula would rise again).
  EXPECT_NEAR(schedule.Multiplier(150), 0.1, kTolerance);
  EXPECT_TRUE(NonIncreasing(schedule, 10, 300));
  EXPECT_LE(LargestJump(schedule, 0, 300), 0.1 + kTolerance);
}

TEST(CosineWithHardRestartsDecayTest, RestartsAtEachCycle) {
  const Schedule schedule(1.0, Warmup{}, CosineWithHardRestartsDecay(100, 2.0));
  EXPECT_NEAR(schedule.Multiplier(0), 1.0, kTolerance);
  EXPECT_NEAR(schedule.Multiplier(25), 0.5, kTolerance);
  EXPECT_NEAR(schedule.Multiplier(50), 1.0, kTolerance);  // the restart
  EXPECT_NEAR(schedule.Multiplier(75), 0.5, kTolerance);
  EXPECT_NEAR(schedule.Multiplier(99), 0.5 * (1.0 + std::cos(kPi * 0.98)), kTolerance);
  EXPECT_NEAR(schedule.Multiplier(100), 0.0, kTolerance);
  EXPECT_TRUE(NonIncreasing(schedule, 0, 49));
  EXPECT_TRUE(NonIncreasing(schedule, 50, 150));
}

TEST(PolynomialDecayTest, PowerAndEnd) {
  const Schedule schedule(1.0, Warmup{.steps = 5}, PolynomialDecay(100, 2.0, 0.01));
  EXPECT_NEAR(schedule.Multiplier(5), 1.0, kTolerance);
  EXPECT_NEAR(schedule.Multiplier(55), 0.99 * 0.25 + 0.01, kTolerance);
  EXPECT_NEAR(schedule.Multiplier(105), 0.01, kTolerance);
  EXPECT_NEAR(schedule.Multiplier(500), 0.01, kTolerance);
  EXPECT_TRUE(NonIncreasing(schedule, 5, 600));
}

TEST(InverseSqrtDecayTest, FallsAsTheInverseSquareRoot) {
  const Schedule schedule(1.0, Warmup{.steps = 100}, InverseSqrtDecay(100));
  EXPECT_NEAR(schedule.Multiplier(99), 0.99, kTolerance);
  EXPECT_NEAR(schedule.Multiplier(100), 1.0, kTolerance);
  EXPECT_NEAR(schedule.Multiplier(400), 0.5, kTolerance);  // sqrt(100 / 400)
  EXPECT_NEAR(schedule.Multiplier(10000), 0.1, kTolerance);
  EXPECT_TRUE(NonIncreasing(schedule, 100, 2000));
}

TEST(StableThenDecayTest, EachShapeEndsAtTheFloor) {
  for (Shape shape : {Shape::kLinear, Shape::kCosine, Shape::kOneMinusSqrt}) {
    SCOPED_TRACE(static_cast<int>(shape));
    const Schedule schedule(1.0, Warmup{.steps = 10, .start_factor = 0.1},
                            StableThenDecay(50, 40, shape, 0.1));
    EXPECT_NEAR(schedule.Multiplier(0), 0.1, kTolerance);
    EXPECT_NEAR(schedule.Multiplier(10), 1.0, kTolerance);
    EXPECT_NEAR(schedule.Multiplier(59), 1.0, kTolerance);  // last stable step
    EXPECT_NEAR(schedule.Multiplier(100), 0.1, kTolerance);
    EXPECT_NEAR(schedule.Multiplier(1000), 0.1, kTolerance);
    EXPECT_TRUE(NonIncreasing(schedule, 10, 200));
  }
  const Schedule linear(1.0, Warmup{}, StableThenDecay(10, 40, Shape::kLinear, 0.0));
  EXPECT_NEAR(linear.Multiplier(30), 0.5, kTolerance);
  const Schedule one_minus_sqrt(1.0, Warmup{}, StableThenDecay(10, 40, Shape::kOneMinusSqrt, 0.0));
  EXPECT_NEAR(one_minus_sqrt.Multiplier(20), 0.5, kTolerance);  // 1 - sqrt(1/4)
}

TEST(StepDecayTest, MultipliesEveryStepSize) {
  const Schedule schedule(1.0, Warmup{.steps = 3}, StepDecay(10, 0.5));
  EXPECT_NEAR(schedule.Multiplier(3), 1.0, kTolerance);
  EXPECT_NEAR(schedule.Multiplier(12), 1.0, kTolerance);
  EXPECT_NEAR(schedule.Multiplier(13), 0.5, kTolerance);
  EXPECT_NEAR(schedule.Multiplier(33), 0.125, kTolerance);
  EXPECT_TRUE(NonIncreasing(schedule, 3, 100));
}

TEST(MultiStepDecayTest, MultipliesAtEachMilestone) {
  const Schedule schedule(1.0, Warmup{}, MultiStepDecay({30, 80}, 0.1));
  EXPECT_NEAR(schedule.Multiplier(29), 1.0, kTolerance);
  EXPECT_NEAR(schedule.Multiplier(30), 0.1, kTolerance);
  EXPECT_NEAR(schedule.Multiplier(79), 0.1, kTolerance);
  EXPECT_NEAR(schedule.Multiplier(80), 0.01, kTolerance);
  EXPECT_NEAR(schedule.Multiplier(10000), 0.01, kTolerance);
}

TEST(ExponentialDecayTest, MultipliesEveryStep) {
  const Schedule schedule(2.0, Warmup{.steps = 2}, ExponentialDecay(0.9));
  EXPECT_NEAR(schedule.LearningRate(2), 2.0, kTolerance);
  EXPECT_NEAR(schedule.LearningRate(12), 2.0 * std::pow(0.9, 10), kTolerance);
  EXPECT_TRUE(NonIncreasing(schedule, 2, 200));
}

TEST(ScheduleTest, IsAPureFunctionOfTheStep) {
  const Schedule schedule(1.0, Warmup{.steps = 10}, CosineDecay(90));
  const double late = schedule.LearningRate(70);
  for (int64_t step = 0; step < 100; ++step) schedule.LearningRate(step);
  EXPECT_EQ(schedule.LearningRate(70), late);
  const Schedule copy = schedule;
  EXPECT_EQ(copy.LearningRate(70), late);
}

}  // namespace
}  // namespace plait::sched
