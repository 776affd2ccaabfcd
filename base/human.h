// Numbers as a person reads them in explanations and logs: counts with a K/M/B suffix, byte
// sizes in MiB or GiB, and a count with the noun that agrees with it.
//
//   HumanCount(1.2e6) == "1.2M";  HumanBytes(3 << 20) == "3.0 MiB"
//   HumanBytesAnySize(3072) == "3.0 KiB";  CountOf(1, "step", "steps") == "1 step"
#ifndef PLAIT_BASE_HUMAN_H_
#define PLAIT_BASE_HUMAN_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace plait::base {

inline std::string HumanCount(double n) {
  if (n >= 1e9) return absl::StrFormat("%.1fB", n / 1e9);
  if (n >= 1e6) return absl::StrFormat("%.1fM", n / 1e6);
  if (n >= 1e3) return absl::StrFormat("%.1fK", n / 1e3);
  return absl::StrCat(static_cast<int64_t>(n));
}

inline std::string HumanBytes(double n) {
  if (n >= 1 << 30) return absl::StrFormat("%.2f GiB", n / (1 << 30));
  return absl::StrFormat("%.1f MiB", n / (1 << 20));
}

// As HumanBytes, with sizes under a MiB in KiB, and under a KiB in bytes: for lists whose
// small entries matter (a collective of a few norm weights' gradients), where HumanBytes
// would show 0.0 MiB.
inline std::string HumanBytesAnySize(double n) {
  if (n >= 1 << 20) return HumanBytes(n);
  if (n >= 1 << 10) return absl::StrFormat("%.1f KiB", n / (1 << 10));
  return absl::StrFormat("%.0f bytes", n);
}

// `n` and `one` for 1, `many` otherwise: "1 step", "0 steps", "2 steps".
inline std::string CountOf(int64_t n, absl::string_view one, absl::string_view many) {
  return absl::StrCat(n, " ", n == 1 ? one : many);
}

}  // namespace plait::base

#endif  // PLAIT_BASE_HUMAN_H_
