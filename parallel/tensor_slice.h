// Which part of a global tensor a rank holds: the global shape, and a box of it (an offset
// and a length per dimension). The wrappers that split parameters (wrap/: tensor parallelism
// slices along a dimension, FSDP shards dim 0) record it on each TrainableParameter, so that
// a checkpoint can save every rank's part under the global name and a run on another layout
// can read back exactly the parts it needs (checkpoint/checkpointer.h).
//
//   TensorSlice slice = TensorSlice::Whole({256, 64});  // one process: everything
//   slice = slice.Narrow(0, 128, 128);                   // rank 1 of 2 along dim 0
//   at::Tensor data = slice.DataOf(local);            // [128, 64], padding excluded
//
// A rank's local tensor may be larger than its box (FSDP pads the last shards): the box's
// elements are the local tensor's first box.numel() elements in row-major order, the rest is
// padding. Several ranks may hold the same box (replicated parameters, DDP): `replica`
// numbers them, and only replica 0 saves it.
#ifndef PLAIT_PARALLEL_TENSOR_SLICE_H_
#define PLAIT_PARALLEL_TENSOR_SLICE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"

namespace plait::parallel {

// A box of a tensor: an offset and a length per dimension.
struct Box {
  std::vector<int64_t> offsets;
  std::vector<int64_t> lengths;

  // Elements in the box (1 for a scalar's box of no dimensions).
  int64_t numel() const;
  bool operator==(const Box& other) const {
    return offsets == other.offsets && lengths == other.lengths;
  }
};

// The box `a` and `b` share; nullopt when they share no element.
std::optional<Box> Intersect(const Box& a, const Box& b);

// `tensor` (shaped as the box `outer`) narrowed to the part of it in `inner`, a box inside
// `outer`.
at::Tensor NarrowTo(const at::Tensor& tensor, const Box& outer, const Box& inner);

struct TensorSlice {
  std::vector<int64_t> global_shape;
  Box box;  // in global_shape
  // This rank's index among the ranks that hold the same box; replica 0 saves it.
  int64_t replica = 0;

  // All of a tensor of `shape`.
  static TensorSlice Whole(c10::IntArrayRef shape);

  // The sub-box of `length` entries from `start` along `dim`, counted inside this box; what
  // of them lies past this box's end is padding of the rank's tensor, left out.
  TensorSlice Narrow(int64_t dim, int64_t start, int64_t length) const;

  // The box's elements in `local` (this rank's tensor, padding after them), shaped as the box.
  at::Tensor DataOf(const at::Tensor& local) const;

  // "[0:128, 0:64] of [256, 64]".
  std::string DebugString() const;
};

}  // namespace plait::parallel

#endif  // PLAIT_PARALLEL_TENSOR_SLICE_H_
