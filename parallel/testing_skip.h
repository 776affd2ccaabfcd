// A test hook that makes this rank skip collectives, as a rank whose code took another path
// would: the collectives `skip` picks are not run, count as not issued (the next one takes
// their index) and finish at once without error. What the other ranks then see is what a
// hang test checks (the errors that name the collective, and the rank that was not there):
//
//   SkipCollectiveForTesting(dp, [](const CollectiveCall& call) {
//     return call.collective == Collective::kReduceScatter && call.place.block == 1;
//   });
#ifndef PLAIT_PARALLEL_TESTING_SKIP_H_
#define PLAIT_PARALLEL_TESTING_SKIP_H_

#include <functional>

#include "parallel/communicator.h"

namespace plait::parallel {

// From now on, `communicator` skips every collective for which `skip` is true (asked before
// each is issued, on the issuing thread); a null `skip` skips none.
void SkipCollectiveForTesting(Communicator& communicator,
                              std::function<bool(const CollectiveCall&)> skip);

}  // namespace plait::parallel

#endif  // PLAIT_PARALLEL_TESTING_SKIP_H_
