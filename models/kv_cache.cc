#include "models/kv_cache.h"

#include <limits>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/empty.h"
#include "ATen/ops/full.h"
#include "ATen/ops/where.h"
#include "c10/util/Exception.h"

namespace plait::models {

KvCache::KvCache(at::Tensor pads, int64_t capacity)
    : pads_(pads.to(at::kLong).contiguous()), capacity_(capacity) {
  TORCH_CHECK(pads_.dim() == 1, "KvCache: pads must be [rows], not ", pads_.sizes());
}

int64_t KvCache::bytes() const {
  int64_t bytes = 0;
  for (const auto& [layer, kv] : layers_) {
    bytes += static_cast<int64_t>(kv.first.nbytes() + kv.second.nbytes());
  }
  return bytes;
}

at::Tensor KvCache::Positions(int64_t count, const at::Device& device) const {
  const at::Tensor index = at::arange(length_, length_ + count, at::TensorOptions(at::kLong));
  return (index.unsqueeze(0) - pads_.unsqueeze(1)).clamp_min(0).to(device);
}

at::Tensor KvCache::Mask(int64_t count, at::ScalarType dtype, const at::Device& device) const {
  const auto options = at::TensorOptions(at::kLong);
  const at::Tensor query = at::arange(length_, length_ + count, options).view({1, count, 1});
  const at::Tensor key = at::arange(length_ + count, options).view({1, 1, length_ + count});
  const at::Tensor pads = pads_.view({-1, 1, 1});
  const at::Tensor meets = ((key >= pads) & (key <= query)) | (key == query);
  const at::Tensor zero = at::full({}, 0.0, at::TensorOptions(dtype));
  const at::Tensor blocked =
      at::full({}, -std::numeric_limits<double>::infinity(), at::TensorOptions(dtype));
  return at::where(meets, zero, blocked).to(device);
}

std::pair<at::Tensor, at::Tensor> KvCache::Append(int64_t layer, const at::Tensor& k,
                                                  const at::Tensor& v) {
  const int64_t count = k.size(1);
  TORCH_CHECK(k.size(0) == rows() && v.sizes() == k.sizes(), "KvCache: keys ", k.sizes(),
              " and values ", v.sizes(), " are not [", rows(), ", T, heads, d]");
  TORCH_CHECK(length_ + count <= capacity_, "KvCache: ", length_, " + ", count,
              " tokens exceed its capacity of ", capacity_);
  auto [entry, added] = layers_.try_emplace(layer);
  at::Tensor& keys = entry->second.first;
  at::Tensor& values = entry->second.second;
  if (added) {
    // Heads first: each head's keys are rows of one matrix, which attention reads in place.
    const std::vector<int64_t> shape = {rows(), k.size(2), capacity_, k.size(3)};
    keys = at::empty(shape, k.options());
    values = at::empty(shape, v.options());
  }
  keys.narrow(2, length_, count).copy_(k.transpose(1, 2));
  values.narrow(2, length_, count).copy_(v.transpose(1, 2));
  return {keys.narrow(2, 0, length_ + count), values.narrow(2, 0, length_ + count)};
}

void KvCache::Advance(int64_t count) { length_ += count; }

}  // namespace plait::models
