#include "sched/schedule.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace plait::sched {
namespace {

constexpr double kPi = 3.14159265358979323846;

// Progress through a phase of `length` steps after `step` of them, clamped to [0, 1]. As in
// Hugging Face, a phase of length 0 counts as length 1.
double Progress(int64_t step, int64_t length) {
  const double clamped = static_cast<double>(std::clamp<int64_t>(step, 0, length));
  return clamped / static_cast<double>(std::max<int64_t>(length, 1));
}

double Rise(Shape shape, double p) {
  switch (shape) {
    case Shape::kLinear:
      return p;
    case Shape::kCosine:
      return 0.5 * (1.0 - std::cos(kPi * p));
    case Shape::kOneMinusSqrt:
      return 1.0 - std::sqrt(1.0 - p);
  }
  return p;
}

// The decay shapes, falling from 1 to 0 as q goes from 0 to 1 (cosine: over num_cycles
// cycles, half a cycle being one fall).
double Fall(Shape shape, double q, double num_cycles) {
  switch (shape) {
    case Shape::kLinear:
      return 1.0 - q;
    case Shape::kCosine:
      return 0.5 * (1.0 + std::cos(2.0 * kPi * num_cycles * q));
    case Shape::kOneMinusSqrt:
      return 1.0 - std::sqrt(q);
  }
  return 1.0 - q;
}

double Lerp(double from, double to, double t) { return from + (to - from) * t; }

}  // namespace

double Warmup::Multiplier(int64_t step) const {
  const int64_t position = convention == Convention::kSkipsZero ? step + 1 : step;
  return Lerp(start_factor, 1.0, Rise(shape, Progress(position, steps)));
}

Decay ConstantDecay() {
  return [](int64_t) { return 1.0; };
}

Decay LinearDecay(int64_t length) {
  return [length](int64_t d) { return Fall(Shape::kLinear, Progress(d, length), 0.0); };
}

Decay CosineDecay(int64_t length, double num_cycles, double min_ratio) {
  return [=](int64_t d) {
    return Lerp(min_ratio, 1.0, Fall(Shape::kCosine, Progress(d, length), num_cycles));
  };
}

Decay CosineWithHardRestartsDecay(int64_t length, double num_cycles) {
  return [=](int64_t d) {
    if (d >= length) return 0.0;
    const double p = Progress(d, length);
    return 0.5 * (1.0 + std::cos(kPi * std::fmod(num_cycles * p, 1.0)));
  };
}

Decay PolynomialDecay(int64_t length, double power, double end_ratio) {
  return [=](int64_t d) {
    const double remaining = 1.0 - Progress(d, length);
    return Lerp(end_ratio, 1.0, std::pow(remaining, power));
  };
}

Decay InverseSqrtDecay(int64_t timescale) {
  return [timescale](int64_t d) {
    return std::sqrt(static_cast<double>(timescale) / static_cast<double>(d + timescale));
  };
}

Decay StableThenDecay(int64_t stable_steps, int64_t decay_steps, Shape decay_shape,
                      double min_ratio, double num_cycles) {
  return [=](int64_t d) {
    if (d < stable_steps) return 1.0;
    const double q = Progress(d - stable_steps, decay_steps);
    return Lerp(min_ratio, 1.0, Fall(decay_shape, q, num_cycles));
  };
}

Decay StepDecay(int64_t step_size, double gamma) {
  return [=](int64_t d) { return std::pow(gamma, static_cast<double>(d / step_size)); };
}

Decay MultiStepDecay(std::vector<int64_t> milestones, double gamma) {
  return [milestones = std::move(milestones), gamma](int64_t d) {
    const auto passed = std::upper_bound(milestones.begin(), milestones.end(), d);
    return std::pow(gamma, static_cast<double>(passed - milestones.begin()));
  };
}

Decay ExponentialDecay(double gamma) {
  return [gamma](int64_t d) { return std::pow(gamma, static_cast<double>(d)); };
}

Schedule::Schedule(double peak_lr, Warmup warmup, Decay decay)
    : peak_lr_(peak_lr), warmup_(warmup), decay_(std::move(decay)) {}

double Schedule::Multiplier(int64_t step) const {
  step = std::max<int64_t>(step, 0);
  if (step < warmup_.steps) return warmup_.Multiplier(step);
  return decay_(step - warmup_.steps);
}

}  // namespace plait::sched
