#include "parallel/graph_group.h"

#include <cstdint>
#include <utility>

namespace plait::parallel {

void GraphGroup::Wait(const std::shared_ptr<Work>& work) {
  absl::Status status = work->Wait();
  if (status.ok()) return;
  absl::MutexLock lock(&mutex_);
  if (status_.ok()) status_ = std::move(status);
}

absl::Status GraphGroup::status() const {
  absl::MutexLock lock(&mutex_);
  return status_;
}

void GraphGroup::SaveIn(torch::autograd::AutogradContext* ctx) {
  ctx->saved_data["group"] = reinterpret_cast<int64_t>(this);
}

GraphGroup& GraphGroup::SavedIn(torch::autograd::AutogradContext* ctx) {
  return *reinterpret_cast<GraphGroup*>(ctx->saved_data["group"].toInt());
}

}  // namespace plait::parallel
