// AllToAll and ExchangeRowCounts on RingCommunicator: exact rows in place for uneven counts
// with zeros, several dtypes and a row shape, traffic, the round trip of expert parallelism,
// argument errors, counts that disagree between ranks, and a group of one.
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "ATen/Parallel.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/cat.h"
#include "ATen/ops/equal.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/communicator.h"
#include "parallel/test_ranks.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::parallel {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::IsOkAndHolds;
using ::plait::base::testing::StatusIs;
using ::plait::parallel::testing::RunOnRingGroup;
using ::testing::AllOf;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// Every row is [3, 5].
constexpr int64_t kRowNumel = 15;

// counts[q][r]: the rows rank q sends rank r.
using Counts = std::vector<std::vector<int64_t>>;

// Uneven, with rank 0 sending nothing and the last rank receiving nothing from the others
// (with 2 ranks, rank 1's rows to rank 0 are all that crosses).
Counts Sparse(int size) {
  Counts counts(size, std::vector<int64_t>(size));
  for (int q = 1; q < size; ++q) {
    for (int r = 0; r < size; ++r) {
      counts[q][r] = r == size - 1 && q != r ? 0 : (q + 2 * r) % 4;
    }
  }
  return counts;
}

// Every count from 1 to 5.
Counts Dense(int size) {
  Counts counts(size, std::vector<int64_t>(size));
  for (int q = 0; q < size; ++q) {
    for (int r = 0; r < size; ++r) counts[q][r] = 1 + (3 * q + r) % 5;
  }
  return counts;
}

Counts Empty(int size) { return Counts(size, std::vector<int64_t>(size, 0)); }

std::vector<int64_t> Column(const Counts& counts, int r) {
  std::vector<int64_t> column;
  for (const std::vector<int64_t>& row : counts) column.push_back(row[r]);
  return column;
}

int64_t Sum(const std::vector<int64_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), int64_t{0});
}

// Rank q's input: values below 251, exact in bf16, that differ between senders and between
// neighbouring rows.
at::Tensor Input(int q, const Counts& counts, at::ScalarType dtype) {
  const int64_t rows = Sum(counts[q]);
  return (torch::arange(rows * kRowNumel, at::kLong) * 7 + 1000 * q)
      .remainder(251)
      .reshape({rows, 3, 5})
      .to(dtype);
}

// What rank r receives: every rank's rows for it, in rank order.
at::Tensor Expected(int r, const Counts& counts, at::ScalarType dtype) {
  std::vector<at::Tensor> parts;
  for (int q = 0; q < static_cast<int>(counts.size()); ++q) {
    const int64_t offset = std::accumulate(counts[q].begin(), counts[q].begin() + r, int64_t{0});
    parts.push_back(Input(q, counts, dtype).narrow(0, offset, counts[q][r]));
  }
  return at::cat(parts);
}

class AllToAllTest : public ::testing::TestWithParam<int> {};

TEST_P(AllToAllTest, RowsArriveInPlaceAndTrafficCountsTheOtherRanks) {
  const int size = GetParam();
  RunOnRingGroup("ep", size, [&](int rank, Communicator& comm) {
    at::set_num_threads(1);
    int64_t calls = 0;
    for (const auto& [name, counts] :
         {std::pair{"sparse", Sparse(size)}, {"dense", Dense(size)}, {"empty", Empty(size)}}) {
      for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
        SCOPED_TRACE(absl::StrCat(name, " ", c10::toString(dtype)));
        const std::vector<int64_t> receive_rows = Column(counts, rank);
        at::Tensor output = torch::full({Sum(receive_rows), 3, 5}, -1, dtype);
        const Traffic before = comm.traffic(Collective::kAllToAll);
        ASSERT_THAT(
            comm.AllToAll(Input(rank, counts, dtype), output, counts[rank], receive_rows)->Wait(),
            IsOk());
        EXPECT_TRUE(at::equal(output, Expected(rank, counts, dtype)));

        const int64_t row_bytes = kRowNumel * c10::elementSize(dtype);
        const Traffic after = comm.traffic(Collective::kAllToAll);
        EXPECT_EQ(after.calls, ++calls);
        EXPECT_EQ(after.bytes_sent - before.bytes_sent,
                  (Sum(counts[rank]) - counts[rank][rank]) * row_bytes);
        EXPECT_EQ(after.bytes_received - before.bytes_received,
                  (Sum(receive_rows) - counts[rank][rank]) * row_bytes);
      }
    }
  });
}

// Expert parallelism's round trip: ExchangeRowCounts sizes the tokens each rank receives, and
// the reverse all-to-all brings them back where they were.
TEST_P(AllToAllTest, TokensGoToTheirExpertsAndComeBack) {
  const int size = GetParam();
  const Counts counts = Sparse(size);
  RunOnRingGroup("ep", size, [&](int rank, Communicator& comm) {
    at::set_num_threads(1);
    absl::StatusOr<std::vector<int64_t>> receive_rows = ExchangeRowCounts(comm, counts[rank]);
    ASSERT_THAT(receive_rows, IsOkAndHolds(ElementsAreArray(Column(counts, rank))));
    const at::Tensor tokens = Input(rank, counts, at::kFloat);
    at::Tensor routed = torch::empty({Sum(*receive_rows), 3, 5});
    ASSERT_THAT(comm.AllToAll(tokens, routed, counts[rank], *receive_rows)->Wait(), IsOk());
    at::Tensor back = torch::empty_like(tokens);
    ASSERT_THAT(comm.AllToAll(routed * 2, back, *receive_rows, counts[rank])->Wait(), IsOk());
    EXPECT_TRUE(at::equal(back, tokens * 2));
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, AllToAllTest, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "_ranks";
                         });

TEST(AllToAllGroupOfOneTest, CopiesLocallyAndSendsNothing) {
  RunOnRingGroup("solo", 1, [](int, Communicator& comm) {
    const at::Tensor input = torch::arange(30, at::kFloat).reshape({2, 3, 5});
    at::Tensor output = torch::zeros({2, 3, 5});
    ASSERT_THAT(comm.AllToAll(input, output, {2}, {2})->Wait(), IsOk());
    EXPECT_TRUE(at::equal(output, input));
    EXPECT_THAT(ExchangeRowCounts(comm, {4}), IsOkAndHolds(ElementsAreArray({4})));
    const Traffic traffic = comm.traffic(Collective::kAllToAll);
    EXPECT_EQ(traffic.calls, 2);
    EXPECT_EQ(traffic.bytes_sent, 0);
    EXPECT_EQ(traffic.bytes_received, 0);
  });
}

TEST(AllToAllErrorsTest, RejectsBadArgumentsWithNamedErrors) {
  RunOnRingGroup("ep", 2, [](int rank, Communicator& comm) {
    const auto invalid = [&](const std::string& message) {
      return StatusIs(
          absl::StatusCode::kInvalidArgument,
          AllOf(HasSubstr(absl::StrCat("all_to_all on group 'ep' (rank ", rank, " of 2): ")),
                HasSubstr(message)));
    };
    const at::Tensor rows = torch::zeros({3, 4});
    EXPECT_THAT(comm.AllToAll(rows, rows.clone(), {3}, {1, 2})->Wait(),
                invalid("send_rows has 1 counts; it needs one per rank of the group (2)"));
    EXPECT_THAT(comm.AllToAll(rows, rows.clone(), {4, -1}, {1, 2})->Wait(),
                invalid("send_rows[1] is -1; a count of rows is at least 0"));
    EXPECT_THAT(comm.AllToAll(rows, rows.clone(), {1, 1}, {1, 2})->Wait(),
                invalid("send_rows [1, 1] sum to 2, but input has 3 rows"));
    EXPECT_THAT(comm.AllToAll(rows, torch::zeros({2, 4}), {1, 2}, {1, 2})->Wait(),
                invalid("receive_rows [1, 2] sum to 3, but output has 2 rows"));
    EXPECT_THAT(comm.AllToAll(rows, torch::zeros({3, 5}), {1, 2}, {1, 2})->Wait(),
                invalid("input is Float [3, 4] and output Float [3, 5]; their rows"));
    EXPECT_THAT(comm.AllToAll(rows, torch::zeros({3, 4}, at::kLong), {1, 2}, {1, 2})->Wait(),
                invalid("input is Float [3, 4] and output Long [3, 4]"));
    EXPECT_THAT(comm.AllToAll(torch::tensor(1.0f), rows, {0, 0}, {1, 2})->Wait(),
                invalid("input is a 0-dim tensor"));
    EXPECT_THAT(comm.AllToAll(rows.t(), rows, {2, 2}, {1, 2})->Wait(),
                invalid("input is not contiguous"));
    EXPECT_THAT(comm.AllToAll(rows, rows.clone(), {2, 1}, {1, 2})->Wait(),
                invalid(rank == 0 ? "send_rows[0] is 2 but receive_rows[0] is 1"
                                  : "send_rows[1] is 1 but receive_rows[1] is 2"));
    EXPECT_THAT(ExchangeRowCounts(comm, {1, 2, 3}),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("exchanging row counts on group 'ep' (rank ", rank,
                                                " of 2): send_rows has 3 counts"))));
    // Rejected arguments are not issued and do not break the group.
    EXPECT_EQ(comm.traffic(Collective::kAllToAll).calls, 0);
    EXPECT_THAT(comm.Barrier()->Wait(), IsOk());
  });
}

// Rank 0 sends rank 2 two rows where rank 2 expects one. Every rank fails alike, naming both
// ranks and both counts, in the step's numbering; none waits for the timeout.
TEST(AllToAllErrorsTest, CountsThatDisagreeBetweenRanksFailOnEveryRank) {
  Counts counts = Dense(3);
  counts[0][2] = 2;
  std::vector<int64_t> receive_rows_of_2 = Column(counts, 2);
  receive_rows_of_2[0] = 1;
  RunOnRingGroup("ep", 3, [&](int rank, Communicator& comm) {
    comm.BeginStep(5);
    ASSERT_THAT(comm.Barrier()->Wait(), IsOk());
    const std::vector<int64_t> receive_rows = rank == 2 ? receive_rows_of_2 : Column(counts, rank);
    at::Tensor output = torch::empty({Sum(receive_rows), 3, 5});
    const absl::Status status =
        comm.AllToAll(Input(rank, counts, at::kFloat), output, counts[rank], receive_rows)->Wait();
    EXPECT_THAT(status,
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat(
                             "step 5, all_to_all on group 'ep' (rank ", rank,
                             " of 3; collective #1 of the step): rank 0 sends 2 rows to rank 2 "
                             "(its send_rows[2]), but rank 2 expects 1 from rank 0 (its "
                             "receive_rows[0])"))));
    EXPECT_EQ(comm.FirstFailure(), "step 5, all_to_all on group 'ep' (collective #1 of the step)");
  });
}

TEST(AllToAllErrorsTest, RowsOfAnotherDtypeOnOneRankFailOnEveryRank) {
  RunOnRingGroup("ep", 2, [&](int rank, Communicator& comm) {
    const at::ScalarType dtype = rank == 1 ? at::kBFloat16 : at::kFloat;
    const at::Tensor rows = torch::zeros({2, 3, 5}, dtype);
    EXPECT_THAT(comm.AllToAll(rows, rows.clone(), {1, 1}, {1, 1})->Wait(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("rank 1's rows are BFloat16[15] where rank 0's are Float[15]; "
                                   "every rank must exchange rows of one dtype and size")));
  });
}

}  // namespace
}  // namespace plait::parallel
