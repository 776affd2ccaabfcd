// The data config (data.proto) before anything reads it: ResolvedDataConfig fills in what a
// config leaves unset (the default synthetic source, SyntheticData's defaults), so that every
// caller (loaders, checkpoint fingerprints, a plan's explanation) sees the same source, and
// CheckDataConfig lists every problem, each under its field, before any file is opened:
//
//   const DataConfig data = ResolvedDataConfig(plan.data());
//   for (const base::Violation& p : CheckDataConfig(plan.data(), vocab_size, "plan.data")) {
//     // p.field: "plan.data.token_files.train_path", p.message: "\"a.bin\" does not exist"
//   }
#ifndef PLAIT_DATA_DATA_CONFIG_H_
#define PLAIT_DATA_DATA_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "base/violation.h"
#include "data/data.pb.h"

namespace plait::data {

// The defaults of SyntheticData's optional fields (data.proto).
inline constexpr int64_t kDefaultNumStates = 64;
inline constexpr int64_t kDefaultBranching = 4;
inline constexpr double kDefaultPeak = 2.0;

// `data`, or the default synthetic source when it names none, with SyntheticData's defaults
// filled in.
DataConfig ResolvedDataConfig(const DataConfig& data);

// Every problem of `data` (with ResolvedDataConfig's defaults) where it sits at `field_path`
// in the caller's config: synthetic values out of range (num_states checked against
// `vocab_size` when it is known), an unset token format, and token files unnamed or
// missing. Empty when `data` is valid. Reads only `data` and the file system.
std::vector<base::Violation> CheckDataConfig(const DataConfig& data,
                                                std::optional<int64_t> vocab_size,
                                                absl::string_view field_path);

// What `data` (at `field_path` in the caller's config) asks of the rows that the preparation
// rules may refuse beside some steps (wrap/rules.proto's FeatureRule): "packed_rows" (pair
// files packed several sequences a row), "padding_free_rows" (each row padded as a rank's
// examples pack) and "document_masking" (token files masked at each document's start).
std::vector<base::PlanFeature> FeaturesOf(const DataConfig& data, absl::string_view field_path);

}  // namespace plait::data

#endif  // PLAIT_DATA_DATA_CONFIG_H_
