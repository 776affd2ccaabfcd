// The checks of a CheckpointConfig (checkpoint.proto) before a run starts, so that a negative
// interval or a folder that cannot be created is reported with the rest of a config's
// problems rather than at the first save. Each violation names the field under the caller's
// path for the config:
//
//   const CheckpointConfig& config = plan.training().checkpoint();
//   for (const base::Violation& v : CheckConfig(config, "plan.training.checkpoint")) {
//     // v.field: "plan.training.checkpoint.every", v.message: "-5; must be >= 0"
//   }
#ifndef PLAIT_CHECKPOINT_CHECKPOINT_CONFIG_H_
#define PLAIT_CHECKPOINT_CHECKPOINT_CONFIG_H_

#include <string>
#include <vector>

#include "base/violation.h"
#include "checkpoint/checkpoint.pb.h"

namespace plait::checkpoint {

// Every problem of `config`, which sits at `field` in the caller's config: a negative every
// or keep_last, other fields set without a dir, and a dir that cannot be created or written
// (its nearest existing ancestor is not a writable folder). Empty when `config` is valid.
// Reads only `config` and the file system.
std::vector<base::Violation> CheckConfig(const CheckpointConfig& config, const std::string& field);

}  // namespace plait::checkpoint

#endif  // PLAIT_CHECKPOINT_CHECKPOINT_CONFIG_H_
