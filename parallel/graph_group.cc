#include "parallel/graph_group.h"

#include <cstdint>
#include <utility>

namespace plait::parallel {

void GraphGroup::Wait(const std::shared_ptr<Work>& work) {
  const absl::Time start = absl::Now();
  absl::Status status = work->Wait();
  const absl::Duration waited = absl::Now() - start;
  absl::MutexLock lock(&mutex_);
  waited_ += waited;
  if (!status.ok() && status_.ok()) status_ = std::move(status);
}

absl::Duration GraphGroup::waited() const {
  absl::MutexLock lock(&mutex_);
  return waited_;
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
