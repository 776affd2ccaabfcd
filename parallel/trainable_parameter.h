// What an optimizer trains: a named tensor this rank updates, and the groups across which the
// full parameter is split, so that a global gradient norm counts every element exactly once.
// Wrappers (FSDP, tensor parallel) produce these for the parameters of a prepared model and
// optim/ consumes them; the record lives here, below both. Without a wrapper every parameter
// is whole and `sharded_over` is empty.
//
//   TrainableParameter{"model.layers.0.mlp.up_proj.weight", shard, {fsdp_group, tp_group},
//                      /*replicas=*/1, slice}
#ifndef PLAIT_PARALLEL_TRAINABLE_PARAMETER_H_
#define PLAIT_PARALLEL_TRAINABLE_PARAMETER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "parallel/communicator.h"
#include "parallel/tensor_slice.h"

namespace plait::parallel {

struct TrainableParameter {
  std::string name;      // the full parameter's name, the same on every rank
  at::Tensor tensor;     // this rank's part: the whole parameter, or a shard of it
  // The groups over which the parameter is split into disjoint parts; the caller keeps them
  // alive. Across the ranks of any other group, this rank's part is replicated.
  std::vector<parallel::Communicator*> sharded_over;
  // How many ranks of those groups hold this same part (tensor parallelism's key/value heads
  // shared by several ranks), so that it counts once.
  int64_t replicas = 1;
  // The part of the full parameter `tensor` holds, and which of its holders this rank is:
  // whole for a parameter no wrapper split; each wrapper that splits or replicates it
  // narrows or numbers it (checkpoints save and load by it).
  TensorSlice slice;
  // For a 16-bit `tensor`, optionally: the fp32 values, of its shape and device, that the
  // optimizer's master weights start from, of which `tensor` is the rounded copy (a model
  // initialised or loaded in fp32 and computing in bf16). Undefined: `tensor` widened.
  at::Tensor master;
  // For a frozen part that a step holds in a form of its own rather than as a tensor of the
  // model (QLoRA's NF4 base): takes the part's values (of `slice.box`'s shape, in `tensor`'s
  // dtype, on its device) and stores them; `tensor` is then empty and holds no values. Unset
  // for every other part.
  std::function<void(const at::Tensor& values)> store;
};

}  // namespace plait::parallel

#endif  // PLAIT_PARALLEL_TRAINABLE_PARAMETER_H_
