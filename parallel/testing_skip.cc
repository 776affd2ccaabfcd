#include "parallel/testing_skip.h"

#include <utility>

namespace plait::parallel {

void SkipCollectiveForTesting(Communicator& communicator,
                              std::function<bool(const CollectiveCall&)> skip) {
  communicator.skip_for_testing_ = std::move(skip);
}

}  // namespace plait::parallel
