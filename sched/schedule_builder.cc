#include "sched/schedule_builder.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"

namespace plait::sched {
namespace {

// Hugging Face's inverse_sqrt timescale when there is no warmup to take it from.
constexpr int64_t kDefaultInverseSqrtTimescale = 10000;
// Hugging Face's default polynomial lr_end.
constexpr double kDefaultPolynomialLrEnd = 1e-7;

// Checks the fields of one config message, naming each as `path.field` in its errors.
class FieldChecker {
 public:
  explicit FieldChecker(std::string path) : path_(std::move(path)) {}

  std::string Name(absl::string_view field) const { return absl::StrCat(path_, ".", field); }

  FieldChecker Sub(absl::string_view field) const { return FieldChecker(Name(field)); }

  template <typename T>
  absl::Status Error(absl::string_view field, T value, absl::string_view problem) const {
    return absl::InvalidArgumentError(absl::StrCat(Name(field), ": ", value, " ", problem));
  }

  // Positive and finite: an infinite lr, num_cycles or power makes every rate NaN or 0.
  template <typename T>
  absl::Status Positive(absl::string_view field, T value) const {
    if (!(value > 0)) return Error(field, value, "must be > 0");  // NaN too
    if (!std::isfinite(static_cast<double>(value))) return Error(field, value, "must be finite");
    return absl::OkStatus();
  }

  absl::Status NonNegative(absl::string_view field, int64_t value) const {
    if (value >= 0) return absl::OkStatus();
    return Error(field, value, "must be >= 0");
  }

  absl::Status Fraction(absl::string_view field, double value) const {
    if (value >= 0.0 && value <= 1.0) return absl::OkStatus();
    return Error(field, value, "must be in [0, 1]");
  }

  absl::Status Gamma(absl::string_view field, double value) const {
    if (value > 0.0 && value <= 1.0) return absl::OkStatus();
    return Error(field, value, "must be in (0, 1]");
  }

 private:
  std::string path_;
};

// The context every phase length is checked against.
struct Run {
  int64_t total_steps;
  std::string total_steps_field;
};

// A phase length given in the fields `<prefix>steps` or `<prefix>ratio` (of the run, rounded
// up as HF rounds warmup_ratio), checked to fit in the run; nullopt when neither is set.
absl::StatusOr<std::optional<int64_t>> PhaseLength(const FieldChecker& fields, const Run& run,
                                                   absl::string_view prefix,
                                                   std::optional<int64_t> steps,
                                                   std::optional<double> ratio) {
  const std::string steps_field = absl::StrCat(prefix, "steps");
  if (steps.has_value()) {
    PLAIT_RETURN_IF_ERROR(fields.NonNegative(steps_field, *steps));
    if (*steps > run.total_steps) {
      return fields.Error(steps_field, *steps,
                          absl::StrCat("is longer than the run (", run.total_steps_field, " = ",
                                       run.total_steps, ")"));
    }
    return steps;
  }
  if (ratio.has_value()) {
    PLAIT_RETURN_IF_ERROR(fields.Fraction(absl::StrCat(prefix, "ratio"), *ratio));
    return static_cast<int64_t>(std::ceil(*ratio * static_cast<double>(run.total_steps)));
  }
  return std::nullopt;
}

// The value of a oneof member, or nullopt when another member (or none) is set.
template <typename T>
std::optional<T> IfSet(bool is_set, T value) {
  return is_set ? std::optional<T>(value) : std::nullopt;
}

Shape ToShape(PhaseShape shape, Shape unspecified) {
  switch (shape) {
    case SHAPE_LINEAR:
      return Shape::kLinear;
    case SHAPE_COSINE:
      return Shape::kCosine;
    case SHAPE_ONE_MINUS_SQRT:
      return Shape::kOneMinusSqrt;
    default:
      return unspecified;
  }
}

absl::StatusOr<Warmup> BuildWarmup(const WarmupConfig& config, const FieldChecker& fields,
                                   const Run& run) {
  PLAIT_ASSIGN_OR_RETURN(
      std::optional<int64_t> steps,
      PhaseLength(fields, run, "",
                  IfSet(config.length_case() == WarmupConfig::kSteps, config.steps()),
                  IfSet(config.length_case() == WarmupConfig::kRatio, config.ratio())));
  Warmup warmup;
  warmup.steps = steps.value_or(0);
  warmup.shape = ToShape(config.shape(), Shape::kLinear);
  warmup.convention = config.convention() == WARMUP_SKIPS_ZERO ? Warmup::Convention::kSkipsZero
                                                               : Warmup::Convention::kStartsAtZero;
  return warmup;
}

absl::StatusOr<double> NumCycles(const FieldChecker& fields, bool has_num_cycles, double num_cycles,
                                 double default_value) {
  if (!has_num_cycles) return default_value;
  PLAIT_RETURN_IF_ERROR(fields.Positive("num_cycles", num_cycles));
  return num_cycles;
}

absl::StatusOr<Decay> BuildWarmupStableDecay(const WarmupStableDecay& config,
                                             const FieldChecker& fields, const Run& run,
                                             Warmup& warmup) {
  PLAIT_ASSIGN_OR_RETURN(
      std::optional<int64_t> stable_length,
      PhaseLength(
          fields, run, "stable_",
          IfSet(config.stable_case() == WarmupStableDecay::kStableSteps, config.stable_steps()),
          IfSet(config.stable_case() == WarmupStableDecay::kStableRatio, config.stable_ratio())));
  PLAIT_ASSIGN_OR_RETURN(
      std::optional<int64_t> decay_length,
      PhaseLength(
          fields, run, "decay_",
          IfSet(config.decay_case() == WarmupStableDecay::kDecaySteps, config.decay_steps()),
          IfSet(config.decay_case() == WarmupStableDecay::kDecayRatio, config.decay_ratio())));
  if (!stable_length.has_value() && !decay_length.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(fields.Name("stable_steps"), " or ", fields.Name("decay_steps"),
                     " (or their _ratio): at least one must be set; the other is what "
                     "remains of the run"));
  }
  const int64_t after_warmup = run.total_steps - warmup.steps;
  const int64_t stable = stable_length.value_or(after_warmup - decay_length.value_or(0));
  const int64_t decay = decay_length.value_or(after_warmup - stable);
  if (stable < 0 || decay < 0 || stable + decay > after_warmup) {
    return absl::InvalidArgumentError(absl::StrCat(
        fields.Name("stable_steps"), " + ", fields.Name("decay_steps"), ": warmup ", warmup.steps,
        " + stable ", stable, " + decay ", decay, " is longer than the run (",
        run.total_steps_field, " = ", run.total_steps, ")"));
  }
  PLAIT_RETURN_IF_ERROR(fields.Fraction("min_lr_ratio", config.min_lr_ratio()));
  PLAIT_ASSIGN_OR_RETURN(double num_cycles,
                         NumCycles(fields, config.has_num_cycles(), config.num_cycles(), 0.5));
  // As in HF, the warmup rises from the floor the decay ends at.
  warmup.start_factor = config.min_lr_ratio();
  return StableThenDecay(stable, decay, ToShape(config.decay_shape(), Shape::kCosine),
                         config.min_lr_ratio(), num_cycles);
}

absl::StatusOr<Decay> BuildDecay(const ScheduleConfig& config, const FieldChecker& fields,
                                 const Run& run, Warmup& warmup) {
  const int64_t length = run.total_steps - warmup.steps;
  switch (config.decay_case()) {
    case ScheduleConfig::kConstant:
      if (warmup.steps > 0) {
        return fields.Sub("warmup").Error(
            "steps", warmup.steps,
            "is a warmup, which `constant` does not take (as in HF); use "
            "constant_with_warmup");
      }
      return ConstantDecay();
    case ScheduleConfig::kConstantWithWarmup:
      return ConstantDecay();
    case ScheduleConfig::kLinear:
      return LinearDecay(length);
    case ScheduleConfig::kCosine: {
      const Cosine& cosine = config.cosine();
      PLAIT_ASSIGN_OR_RETURN(
          double num_cycles,
          NumCycles(fields.Sub("cosine"), cosine.has_num_cycles(), cosine.num_cycles(), 0.5));
      return CosineDecay(length, num_cycles);
    }
    case ScheduleConfig::kCosineWithRestarts: {
      const CosineWithRestarts& cosine = config.cosine_with_restarts();
      PLAIT_ASSIGN_OR_RETURN(double num_cycles,
                             NumCycles(fields.Sub("cosine_with_restarts"), cosine.has_num_cycles(),
                                       cosine.num_cycles(), 1.0));
      return CosineWithHardRestartsDecay(length, num_cycles);
    }
    case ScheduleConfig::kCosineWithMinLr: {
      const CosineWithMinLr& cosine = config.cosine_with_min_lr();
      const FieldChecker sub = fields.Sub("cosine_with_min_lr");
      PLAIT_ASSIGN_OR_RETURN(double num_cycles,
                             NumCycles(sub, cosine.has_num_cycles(), cosine.num_cycles(), 0.5));
      double min_ratio = 0.0;
      switch (cosine.floor_case()) {
        case CosineWithMinLr::kMinLr:
          if (!(cosine.min_lr() >= 0.0 && cosine.min_lr() <= config.lr())) {
            return sub.Error(
                "min_lr", cosine.min_lr(),
                absl::StrCat("must be in [0, ", fields.Name("lr"), " = ", config.lr(), "]"));
          }
          min_ratio = cosine.min_lr() / config.lr();
          break;
        case CosineWithMinLr::kMinLrRate:
          PLAIT_RETURN_IF_ERROR(sub.Fraction("min_lr_rate", cosine.min_lr_rate()));
          min_ratio = cosine.min_lr_rate();
          break;
        case CosineWithMinLr::FLOOR_NOT_SET:
          return absl::InvalidArgumentError(absl::StrCat(
              sub.Name("min_lr"), " or ", sub.Name("min_lr_rate"), ": one must be set"));
      }
      return CosineDecay(length, num_cycles, min_ratio);
    }
    case ScheduleConfig::kPolynomial: {
      const Polynomial& polynomial = config.polynomial();
      const FieldChecker sub = fields.Sub("polynomial");
      const double power = polynomial.has_power() ? polynomial.power() : 1.0;
      PLAIT_RETURN_IF_ERROR(sub.Positive("power", power));
      const double lr_end = polynomial.has_lr_end() ? polynomial.lr_end() : kDefaultPolynomialLrEnd;
      if (!(lr_end >= 0.0 && lr_end <= config.lr())) {
        return sub.Error(
            "lr_end", lr_end,
            absl::StrCat("must be in [0, ", fields.Name("lr"), " = ", config.lr(), "]"));
      }
      return PolynomialDecay(length, power, lr_end / config.lr());
    }
    case ScheduleConfig::kInverseSqrt: {
      const InverseSqrt& inverse_sqrt = config.inverse_sqrt();
      int64_t timescale = warmup.steps > 0 ? warmup.steps : kDefaultInverseSqrtTimescale;
      if (inverse_sqrt.has_timescale()) {
        timescale = inverse_sqrt.timescale();
        PLAIT_RETURN_IF_ERROR(fields.Sub("inverse_sqrt").Positive("timescale", timescale));
      }
      return InverseSqrtDecay(timescale);
    }
    case ScheduleConfig::kWarmupStableDecay:
      return BuildWarmupStableDecay(config.warmup_stable_decay(), fields.Sub("warmup_stable_decay"),
                                    run, warmup);
    case ScheduleConfig::kStep: {
      const FieldChecker sub = fields.Sub("step");
      PLAIT_RETURN_IF_ERROR(sub.Positive("step_size", config.step().step_size()));
      PLAIT_RETURN_IF_ERROR(sub.Gamma("gamma", config.step().gamma()));
      return StepDecay(config.step().step_size(), config.step().gamma());
    }
    case ScheduleConfig::kMultistep: {
      const FieldChecker sub = fields.Sub("multistep");
      const auto& milestones = config.multistep().milestones();
      for (int i = 0; i < milestones.size(); ++i) {
        const std::string field = absl::StrCat("milestones[", i, "]");
        PLAIT_RETURN_IF_ERROR(sub.Positive(field, milestones[i]));
        if (i > 0 && milestones[i] <= milestones[i - 1]) {
          return sub.Error(field, milestones[i],
                           absl::StrCat("must be greater than the milestone before it (",
                                        milestones[i - 1], ")"));
        }
      }
      PLAIT_RETURN_IF_ERROR(sub.Gamma("gamma", config.multistep().gamma()));
      return MultiStepDecay({milestones.begin(), milestones.end()}, config.multistep().gamma());
    }
    case ScheduleConfig::kExponential:
      PLAIT_RETURN_IF_ERROR(fields.Sub("exponential").Gamma("gamma", config.exponential().gamma()));
      return ExponentialDecay(config.exponential().gamma());
    case ScheduleConfig::DECAY_NOT_SET:
      break;
  }
  std::vector<std::string> names;
  const auto* oneof = ScheduleConfig::descriptor()->FindOneofByName("decay");
  for (int i = 0; i < oneof->field_count(); ++i) names.push_back(oneof->field(i)->name());
  return absl::InvalidArgumentError(absl::StrCat(
      fields.Name("decay"), ": no schedule is set; set one of ", absl::StrJoin(names, ", ")));
}

}  // namespace

absl::StatusOr<Schedule> BuildSchedule(const ScheduleConfig& config, absl::string_view field_path) {
  const FieldChecker fields{std::string(field_path)};
  PLAIT_RETURN_IF_ERROR(fields.Positive("lr", config.lr()));
  PLAIT_RETURN_IF_ERROR(fields.Positive("total_steps", config.total_steps()));
  const Run run{config.total_steps(), fields.Name("total_steps")};
  PLAIT_ASSIGN_OR_RETURN(Warmup warmup, BuildWarmup(config.warmup(), fields.Sub("warmup"), run));
  PLAIT_ASSIGN_OR_RETURN(Decay decay, BuildDecay(config, fields, run, warmup));
  return Schedule(config.lr(), warmup, std::move(decay));
}

}  // namespace plait::sched
