#include "data/packing.h"

#include <algorithm>
#include <deque>
#include <map>
#include <numeric>

#include "ATen/core/Tensor.h"
#include "ATen/ops/cummax.h"
#include "ATen/ops/where.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::data {

std::vector<std::vector<int64_t>> BestFitDecreasing(const std::vector<int64_t>& lengths,
                                                    int64_t capacity) {
  std::vector<int64_t> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  std::vector<std::vector<int64_t>> rows;
  std::vector<int64_t> used;
  // The rows with free space, by that space; of rows with equal space the first to have it
  // comes first (TRL's deques).
  std::map<int64_t, std::deque<int64_t>> rows_by_space;
  for (const int64_t index : order) {
    const int64_t length = lengths[index];
    int64_t row;
    if (auto fit = rows_by_space.lower_bound(length); fit != rows_by_space.end()) {
      row = fit->second.front();
      fit->second.pop_front();
      if (fit->second.empty()) rows_by_space.erase(fit);
    } else {
      row = static_cast<int64_t>(rows.size());
      rows.emplace_back();
      used.push_back(0);
    }
    rows[row].push_back(index);
    used[row] += length;
    if (used[row] < capacity) rows_by_space[capacity - used[row]].push_back(row);
  }
  return rows;
}

at::Tensor DocumentPositions(const at::Tensor& inputs, int64_t document_start) {
  const int64_t T = inputs.size(1);
  const at::Tensor index =
      torch::arange(T, inputs.options()).unsqueeze(0).expand_as(inputs).contiguous();
  at::Tensor starts = inputs == document_start;
  starts.select(1, 0).fill_(true);
  // Each token's sequence starts at the last start at or before it.
  const at::Tensor last_start =
      std::get<0>(at::cummax(at::where(starts, index, torch::zeros_like(index)), 1));
  return index - last_start;
}

}  // namespace plait::data
