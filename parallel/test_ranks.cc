#include "parallel/test_ranks.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace plait::parallel::testing {

void RunRanks(int num_ranks, const std::function<void(int rank)>& body) {
  std::vector<std::thread> threads;
  threads.reserve(num_ranks);
  for (int rank = 0; rank < num_ranks; ++rank) {
    threads.emplace_back([&body, rank] {
      SCOPED_TRACE(::testing::Message() << "rank " << rank);
      body(rank);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

}  // namespace plait::parallel::testing
