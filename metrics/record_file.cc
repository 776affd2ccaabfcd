#include "metrics/record_file.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/crc32c.h"

namespace plait::metrics {
namespace {

constexpr size_t kLengthBytes = 8;
constexpr size_t kCrcBytes = 4;

void AppendLittleEndian(uint64_t value, size_t bytes, std::string& out) {
  for (size_t i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

uint64_t LittleEndian(absl::string_view bytes) {
  uint64_t value = 0;
  for (size_t i = bytes.size(); i-- > 0;) value = (value << 8) | static_cast<uint8_t>(bytes[i]);
  return value;
}

}  // namespace

std::string FrameRecord(absl::string_view data) {
  std::string record;
  record.reserve(kLengthBytes + 2 * kCrcBytes + data.size());
  AppendLittleEndian(data.size(), kLengthBytes, record);
  AppendLittleEndian(base::MaskedCrc32c(record), kCrcBytes, record);
  record.append(data.data(), data.size());
  AppendLittleEndian(base::MaskedCrc32c(data), kCrcBytes, record);
  return record;
}

absl::StatusOr<Records> ParseRecords(absl::string_view bytes, absl::string_view name) {
  Records records;
  size_t offset = 0;
  while (offset < bytes.size()) {
    const absl::string_view rest = bytes.substr(offset);
    const auto corrupt = [&](absl::string_view what) {
      return absl::DataLossError(
          absl::StrFormat("%s: record %d at byte %d: the CRC of its %s does not match", name,
                          records.records.size(), offset, what));
    };
    if (rest.size() < kLengthBytes + kCrcBytes) break;
    const absl::string_view length_bytes = rest.substr(0, kLengthBytes);
    if (LittleEndian(rest.substr(kLengthBytes, kCrcBytes)) != base::MaskedCrc32c(length_bytes)) {
      return corrupt("length");
    }
    const uint64_t length = LittleEndian(length_bytes);
    if (rest.size() < kLengthBytes + 2 * kCrcBytes ||
        rest.size() - kLengthBytes - 2 * kCrcBytes < length) {
      break;
    }
    const absl::string_view data = rest.substr(kLengthBytes + kCrcBytes, length);
    if (LittleEndian(rest.substr(kLengthBytes + kCrcBytes + length, kCrcBytes)) !=
        base::MaskedCrc32c(data)) {
      return corrupt("data");
    }
    records.records.emplace_back(data);
    offset += kLengthBytes + 2 * kCrcBytes + length;
  }
  records.cut_short_bytes = static_cast<int64_t>(bytes.size() - offset);
  return records;
}

}  // namespace plait::metrics
