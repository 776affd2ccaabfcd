#include "parallel/tensor_slice.h"

#include <algorithm>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace plait::parallel {

int64_t Box::numel() const {
  int64_t n = 1;
  for (const int64_t length : lengths) n *= length;
  return n;
}

std::optional<Box> Intersect(const Box& a, const Box& b) {
  Box common;
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    const int64_t begin = std::max(a.offsets[d], b.offsets[d]);
    const int64_t end = std::min(a.offsets[d] + a.lengths[d], b.offsets[d] + b.lengths[d]);
    if (end <= begin) return std::nullopt;
    common.offsets.push_back(begin);
    common.lengths.push_back(end - begin);
  }
  return common;
}

at::Tensor NarrowTo(const at::Tensor& tensor, const Box& outer, const Box& inner) {
  at::Tensor narrowed = tensor;
  for (size_t d = 0; d < outer.offsets.size(); ++d) {
    narrowed = narrowed.narrow(static_cast<int64_t>(d), inner.offsets[d] - outer.offsets[d],
                               inner.lengths[d]);
  }
  return narrowed;
}

TensorSlice TensorSlice::Whole(c10::IntArrayRef shape) {
  TensorSlice slice;
  slice.global_shape = shape.vec();
  slice.box.offsets.assign(shape.size(), 0);
  slice.box.lengths = shape.vec();
  return slice;
}

TensorSlice TensorSlice::Narrow(int64_t dim, int64_t start, int64_t length) const {
  TensorSlice narrowed = *this;
  const int64_t held = box.lengths[dim];
  const int64_t clipped_start = std::min(start, held);
  narrowed.box.offsets[dim] += clipped_start;
  narrowed.box.lengths[dim] = std::min(length, held - clipped_start);
  return narrowed;
}

at::Tensor TensorSlice::DataOf(const at::Tensor& local) const {
  return local.reshape({-1}).narrow(0, 0, box.numel()).view(box.lengths);
}

std::string TensorSlice::DebugString() const {
  std::vector<std::string> ranges;
  for (size_t d = 0; d < box.offsets.size(); ++d) {
    ranges.push_back(absl::StrCat(box.offsets[d], ":", box.offsets[d] + box.lengths[d]));
  }
  return absl::StrCat("[", absl::StrJoin(ranges, ", "), "] of [", absl::StrJoin(global_shape, ", "),
                      "]");
}

}  // namespace plait::parallel
