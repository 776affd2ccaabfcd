#include "base/crc32c.h"

#include <array>

namespace plait::base {
namespace {

// The Castagnoli polynomial 0x1EDC6F41, bit-reversed (RFC 3720, section 12.1).
constexpr uint32_t kReversedPolynomial = 0x82F63B78;
// TFRecord's mask constant (tensorflow/core/lib/hash/crc32c.h, kMaskDelta).
constexpr uint32_t kMaskDelta = 0xA282EAD8;

// The CRC of every byte value, for one table lookup per byte.
constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? kReversedPolynomial : 0);
    table[byte] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kTable = MakeTable();

}  // namespace

uint32_t Crc32c(absl::string_view data) {
  uint32_t crc = 0xFFFFFFFF;
  for (const char c : data) crc = (crc >> 8) ^ kTable[(crc ^ static_cast<uint8_t>(c)) & 0xFF];
  return crc ^ 0xFFFFFFFF;
}

uint32_t MaskedCrc32c(absl::string_view data) {
  const uint32_t crc = Crc32c(data);
  return ((crc >> 15) | (crc << 17)) + kMaskDelta;
}

}  // namespace plait::base
