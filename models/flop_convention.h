// The one count of model FLOPs behind every MFU figure plait prints (the run's progress and
// summary, model_bench, plan_check's time estimate), in the words printed beside it:
// models::TrainingFlopsPerToken (estimates.h) computes it. A header of its own, without
// LibTorch, so that the libraries that print an MFU depend on the words alone.
#ifndef PLAIT_MODELS_FLOP_CONVENTION_H_
#define PLAIT_MODELS_FLOP_CONVENTION_H_

namespace plait::models {

inline constexpr char kFlopConvention[] = "6N + 6Lsh FLOPs a token, causal attention halved";

}  // namespace plait::models

#endif  // PLAIT_MODELS_FLOP_CONVENTION_H_
