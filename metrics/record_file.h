// The record framing of TensorBoard's event files (TFRecord): each record is the data's length
// (uint64, little-endian), the masked CRC-32C of those 8 bytes, the data, and the masked
// CRC-32C of the data. A writer appends whole records, so a file cut short by a killed run
// reads up to its last full record:
//
//   out << FrameRecord(event.SerializeAsString());
//   PLAIT_ASSIGN_OR_RETURN(Records records, ParseRecords(bytes, path));
#ifndef PLAIT_METRICS_RECORD_FILE_H_
#define PLAIT_METRICS_RECORD_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace plait::metrics {

// `data` as one record.
std::string FrameRecord(absl::string_view data);

struct Records {
  std::vector<std::string> records;  // the data of each full record, in order
  int64_t cut_short_bytes = 0;       // the bytes of a last record cut short, not read
};

// The records of `bytes`, the contents of the file `name` (for errors). A last record cut
// short is not an error (a killed run leaves one); a checksum that does not match is: a
// DataLossError naming the file, the record and its offset.
absl::StatusOr<Records> ParseRecords(absl::string_view bytes, absl::string_view name);

}  // namespace plait::metrics

#endif  // PLAIT_METRICS_RECORD_FILE_H_
