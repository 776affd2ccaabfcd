// The data config (data.proto) as the readers use it: ResolvedDataConfig fills in what a
// config leaves unset, the default synthetic source and SyntheticData's defaults, so that
// every caller (loaders, checkpoint fingerprints, a plan's explanation) sees the same source:
//
//   const DataConfig data = ResolvedDataConfig(plan.data());
//   // data.synthetic().num_states() == kDefaultNumStates when the plan names no source
#ifndef PLAIT_DATA_DATA_CONFIG_H_
#define PLAIT_DATA_DATA_CONFIG_H_

#include <cstdint>

#include "data/data.pb.h"

namespace plait::data {

// The defaults of SyntheticData's optional fields (data.proto).
inline constexpr int64_t kDefaultNumStates = 64;
inline constexpr int64_t kDefaultBranching = 4;
inline constexpr double kDefaultPeak = 2.0;

// `data`, or the default synthetic source when it names none, with SyntheticData's defaults
// filled in.
DataConfig ResolvedDataConfig(const DataConfig& data);

}  // namespace plait::data

#endif  // PLAIT_DATA_DATA_CONFIG_H_
