// Hashes and seed mixing that are the same on every platform and build, for what must agree
// across ranks and runs: per-parameter initialisation seeds, synthetic data streams,
// checkpoint checksums.
//
//   at::Generator g = MakeGenerator(SplitMix64(seed ^ Fnv1a64(name)));
#ifndef PLAIT_BASE_HASH_H_
#define PLAIT_BASE_HASH_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/strings/string_view.h"

namespace plait::base {

// FNV-1a's 64-bit offset basis and prime (Fowler, Noll, Vo).
inline constexpr uint64_t kFnv1a64OffsetBasis = 0xcbf29ce484222325ULL;
inline constexpr uint64_t kFnv1a64Prime = 0x100000001b3ULL;

// FNV-1a, 64 bit, over the bytes of `text`.
inline uint64_t Fnv1a64(absl::string_view text) {
  uint64_t hash = kFnv1a64OffsetBasis;
  for (const unsigned char c : text) hash = (hash ^ c) * kFnv1a64Prime;
  return hash;
}

// FNV-1a's step taken 8 bytes at a time (a tail of fewer bytes byte by byte), continuing from
// `hash`: several times faster than Fnv1a64 on large buffers, for checksums of tensor bytes.
inline uint64_t Fnv1a64Words(uint64_t hash, const void* data, size_t size) {
  const char* bytes = static_cast<const char*>(data);
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t word;
    std::memcpy(&word, bytes + i, 8);
    hash = (hash ^ word) * kFnv1a64Prime;
  }
  for (; i < size; ++i) hash = (hash ^ static_cast<unsigned char>(bytes[i])) * kFnv1a64Prime;
  return hash;
}

// splitmix64's finaliser (Steele, Lea, Flood 2014), so nearby seeds give unrelated values.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace plait::base

#endif  // PLAIT_BASE_HASH_H_
