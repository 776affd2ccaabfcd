#include "data/data_config.h"

namespace plait::data {

DataConfig ResolvedDataConfig(const DataConfig& data) {
  DataConfig resolved = data;
  if (resolved.source_case() == DataConfig::SOURCE_NOT_SET) resolved.mutable_synthetic();
  if (resolved.has_synthetic()) {
    SyntheticData& synthetic = *resolved.mutable_synthetic();
    if (!synthetic.has_num_states()) synthetic.set_num_states(kDefaultNumStates);
    if (!synthetic.has_branching()) synthetic.set_branching(kDefaultBranching);
    if (!synthetic.has_peak()) synthetic.set_peak(kDefaultPeak);
  }
  return resolved;
}

}  // namespace plait::data
