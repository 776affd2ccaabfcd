// Test helpers for running several ranks of a group inside one test process, one thread
// per rank, as the correctness tests of plait's parallel code do.
#ifndef PLAIT_PARALLEL_TEST_RANKS_H_
#define PLAIT_PARALLEL_TEST_RANKS_H_

#include <functional>

namespace plait::parallel::testing {

// Runs `body(rank)` for every rank in [0, num_ranks) on its own thread and waits for all.
void RunRanks(int num_ranks, const std::function<void(int rank)>& body);

}  // namespace plait::parallel::testing

#endif  // PLAIT_PARALLEL_TEST_RANKS_H_
