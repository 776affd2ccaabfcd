// Learning-rate schedules as pure functions of the optimizer step.
//
// A Schedule maps a step (0 for the first optimizer update) to a learning rate and holds no
// state, so a resumed run continues exactly and every value can be checked against its
// closed form. A schedule is a warmup followed by a decay; the decay is a function of the
// steps since the warmup ended. Build one by hand, or from a ScheduleConfig with
// BuildSchedule (schedule_builder.h):
//
//   Schedule schedule(/*peak_lr=*/3e-4, Warmup{.steps = 100}, CosineDecay(/*length=*/900));
//   for (int64_t step = 0; step < 1000; ++step) {
//     optimizer.SetLearningRate(schedule.LearningRate(step));
//     ...
//   }
//
// The decays use the formulas of Hugging Face's get_scheduler family (and PyTorch's StepLR,
// MultiStepLR, ExponentialLR). Below, d is the number of steps since the warmup ended, L the
// decay's length and p = min(d, L) / L its progress; each decay returns the multiplier of the
// peak learning rate.
#ifndef PLAIT_SCHED_SCHEDULE_H_
#define PLAIT_SCHED_SCHEDULE_H_

#include <cstdint>
#include <functional>
#include <vector>

namespace plait::sched {

// How a phase moves from one level to another as its progress p goes from 0 to 1.
enum class Shape {
  kLinear,        // p
  kCosine,        // (1 - cos(pi p)) / 2
  kOneMinusSqrt,  // 1 - sqrt(1 - p)
};

// The warmup: the multiplier rises from `start_factor` to 1 over `steps` steps.
//   kStartsAtZero (Hugging Face): p = s / steps, so step 0 trains at start_factor.
//   kSkipsZero: p = (s + 1) / steps, so the peak is reached at step steps - 1.
// multiplier(s) = start_factor + (1 - start_factor) * shape(p), for s in the warmup.
struct Warmup {
  enum class Convention { kStartsAtZero, kSkipsZero };

  int64_t steps = 0;
  Shape shape = Shape::kLinear;
  Convention convention = Convention::kStartsAtZero;
  double start_factor = 0.0;

  // The multiplier at `step` < `steps`.
  double Multiplier(int64_t step) const;
};

// A decay: the multiplier of the peak learning rate as a function of d >= 0.
using Decay = std::function<double(int64_t steps_since_warmup)>;

// constant: 1.
Decay ConstantDecay();

// linear: 1 - p.
Decay LinearDecay(int64_t length);

// cosine: min_ratio + (1 - min_ratio) * (1 + cos(2 pi num_cycles p)) / 2. With num_cycles 0.5
// and min_ratio 0 this is HF's `cosine`; with a min_ratio, HF's `cosine_with_min_lr`. Past
// the end it holds its final value (HF's formula would turn back up).
Decay CosineDecay(int64_t length, double num_cycles = 0.5, double min_ratio = 0.0);

// cosine_with_restarts: (1 + cos(pi * ((num_cycles p) mod 1))) / 2 for p < 1, then 0.
Decay CosineWithHardRestartsDecay(int64_t length, double num_cycles = 1.0);

// polynomial: (1 - end_ratio) * (1 - p)^power + end_ratio.
Decay PolynomialDecay(int64_t length, double power, double end_ratio);

// inverse_sqrt: sqrt(timescale / (d + timescale)).
Decay InverseSqrtDecay(int64_t timescale);

// The stable and decay phases of warmup_stable_decay: 1 for d < stable_steps, then
// min_ratio + (1 - min_ratio) * f(q) with q the progress through the next decay_steps steps
// and f linear: 1 - q, cosine: (1 + cos(2 pi num_cycles q)) / 2, 1-sqrt: 1 - sqrt(q);
// min_ratio after that.
Decay StableThenDecay(int64_t stable_steps, int64_t decay_steps, Shape decay_shape,
                      double min_ratio, double num_cycles = 0.5);

// step: gamma^floor(d / step_size).
Decay StepDecay(int64_t step_size, double gamma);

// multistep: gamma^(number of milestones <= d); `milestones` sorted ascending.
Decay MultiStepDecay(std::vector<int64_t> milestones, double gamma);

// exponential: gamma^d.
Decay ExponentialDecay(double gamma);

// A warmup followed by a decay, scaled by the peak learning rate.
class Schedule {
 public:
  Schedule(double peak_lr, Warmup warmup, Decay decay);

  // The learning rate of the update at `step` (steps before 0 count as 0).
  double LearningRate(int64_t step) const { return peak_lr_ * Multiplier(step); }

  // LearningRate(step) / peak_lr().
  double Multiplier(int64_t step) const;

  double peak_lr() const { return peak_lr_; }
  const Warmup& warmup() const { return warmup_; }

 private:
  double peak_lr_;
  Warmup warmup_;
  Decay decay_;
};

}  // namespace plait::sched

#endif  // PLAIT_SCHED_SCHEDULE_H_
