// Parameter groups from the ordered name rules of an OptimizerConfig: each parameter joins
// the group of the first rule whose pattern matches its name, or the default group. Each
// group has its own learning-rate scale and weight decay, e.g. no decay for norms and biases:
//
//   param_groups { name: "no_decay" glob: "*norm*" weight_decay: 0 }
//   param_groups { name: "no_decay_bias" glob: "*.bias" weight_decay: 0 }
#ifndef PLAIT_OPTIM_PARAM_GROUPS_H_
#define PLAIT_OPTIM_PARAM_GROUPS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "optim/optimizer.pb.h"

namespace plait::optim {

struct ParamGroup {
  std::string name;  // the rule's name (or "param_groups[i]"), or "default"
  double lr_scale = 1.0;
  double weight_decay = 0.0;
  std::vector<int> members;  // indices into the parameter names, ascending
};

// The groups of `names`, rules first in order, then the default group if it has members.
// InvalidArgument naming the field (optimizer.param_groups[i]...) for a rule without a
// pattern, an invalid regex, a negative or infinite lr_scale or weight_decay, or a rule that
// matches no parameter.
absl::StatusOr<std::vector<ParamGroup>> AssignParamGroups(const std::vector<std::string>& names,
                                                          const OptimizerConfig& config);

}  // namespace plait::optim

#endif  // PLAIT_OPTIM_PARAM_GROUPS_H_
