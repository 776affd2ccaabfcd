// CRC-32C (Castagnoli), the checksum of TensorBoard's event files (metrics/record_file.h): Abseil
// 20220623 has no absl/crc, so a small table-driven one. Masked is the form a record stores,
// so that the CRC of data that embeds CRCs is not itself a CRC:
//
//   uint32_t crc = MaskedCrc32c(record_data);
#ifndef PLAIT_BASE_CRC32C_H_
#define PLAIT_BASE_CRC32C_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace plait::base {

// The CRC-32C of `data` (RFC 3720, appendix B.4): Crc32c("123456789") == 0xE3069283.
uint32_t Crc32c(absl::string_view data);

// Crc32c(data) rotated right by 15 bits plus 0xA282EAD8, as TFRecord (and so TensorBoard)
// stores it.
uint32_t MaskedCrc32c(absl::string_view data);

}  // namespace plait::base

#endif  // PLAIT_BASE_CRC32C_H_
