#include "wrap/strategies.h"

#include "wrap/ddp/ddp.h"
#include "wrap/fsdp/fsdp.h"

namespace plait::wrap {

absl::StatusOr<std::unique_ptr<Strategy>> MakeStrategy(const PrepareStep& step) {
  switch (step.strategy_case()) {
    case PrepareStep::kFsdp:
      return std::make_unique<fsdp::FsdpStrategy>(step.fsdp());
    case PrepareStep::kDdp:
      return std::make_unique<ddp::DdpStrategy>(step.ddp());
    case PrepareStep::STRATEGY_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("names no strategy; set one of fsdp, ddp");
}

}  // namespace plait::wrap
