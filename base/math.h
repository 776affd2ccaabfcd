// Integer arithmetic the libraries share: shard sizes, padded lengths.
//
//   const int64_t rows_per_rank = CeilDiv(full_rows, ranks);  // the last shard is padded
#ifndef PLAIT_BASE_MATH_H_
#define PLAIT_BASE_MATH_H_

#include <cstdint>

namespace plait::base {

// ceil(numerator / denominator) for a positive denominator and a non-negative numerator.
inline constexpr int64_t CeilDiv(int64_t numerator, int64_t denominator) {
  return (numerator + denominator - 1) / denominator;
}

}  // namespace plait::base

#endif  // PLAIT_BASE_MATH_H_
