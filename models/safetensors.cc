#include "models/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/isfinite.h"
#include "ATen/ops/isnan.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/file.h"
#include "base/json.h"
#include "base/status.h"
#include "nlohmann/json.hpp"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::models {
namespace {

using Json = nlohmann::json;

// The safetensors header length is an unsigned 64-bit little-endian integer (the format's
// specification).
constexpr size_t kHeaderLengthBytes = 8;
// The reference implementation pads the header with spaces to a multiple of 8 bytes, so
// the data is aligned for every supported dtype.
constexpr size_t kHeaderAlignment = 8;
constexpr char kMetadataKey[] = "__metadata__";

struct DtypeName {
  const char* name;
  at::ScalarType dtype;
};
constexpr DtypeName kDtypes[] = {
    {"F32", at::kFloat},
    {"BF16", at::kBFloat16},
    {"F16", at::kHalf},
    {"I64", at::kLong},
};

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status Corrupt(const std::string& path, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", problem));
}

bool ToUint64(const Json& value, uint64_t& out) {
  if (value.is_number_unsigned()) {
    out = value.get<uint64_t>();
    return true;
  }
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    out = static_cast<uint64_t>(value.get<int64_t>());
    return true;
  }
  return false;
}

absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& path, const std::string& name,
                                            const Json& value, uint64_t data_size) {
  const std::string where = absl::StrCat("tensor \"", name, "\": ");
  if (!value.is_object()) return Corrupt(path, absl::StrCat(where, "entry is not an object"));
  SafetensorsEntry entry;
  auto dtype = value.find("dtype");
  if (dtype == value.end() || !dtype->is_string()) {
    return Corrupt(path, absl::StrCat(where, "missing or non-string dtype"));
  }
  const std::string dtype_name = dtype->get<std::string>();
  const std::optional<at::ScalarType> known = SafetensorsDtypeOfName(dtype_name);
  if (known.has_value()) entry.dtype = *known;
  if (!known.has_value()) {
    return Corrupt(path, absl::StrCat(where, "dtype \"", dtype_name,
                                      "\" is not supported (F32, BF16, F16, I64)"));
  }
  auto shape = value.find("shape");
  if (shape == value.end() || !shape->is_array()) {
    return Corrupt(path, absl::StrCat(where, "missing or non-array shape"));
  }
  uint64_t numel = 1;
  bool overflow = false;
  // A zero dimension makes numel 0 whatever the others are, but a tensor's strides multiply
  // every other dimension (as at least 1): they must fit in int64 too.
  uint64_t stride_span = 1;
  bool strides_overflow = false;
  for (size_t i = 0; i < shape->size(); ++i) {
    const Json& dim = (*shape)[i];
    uint64_t size = 0;
    if (!ToUint64(dim, size) || size > static_cast<uint64_t>(INT64_MAX)) {
      return Corrupt(path, absl::StrCat(where, "shape[", i, "] is ", base::DescribeJson(dim),
                                        "; a dimension is an integer in [0, 2^63)"));
    }
    entry.shape.push_back(static_cast<int64_t>(size));
    overflow = overflow || __builtin_mul_overflow(numel, size, &numel);
    strides_overflow =
        strides_overflow ||
        __builtin_mul_overflow(stride_span, std::max<uint64_t>(size, 1), &stride_span) ||
        stride_span > static_cast<uint64_t>(INT64_MAX);
  }
  if (strides_overflow) {
    return Corrupt(path, absl::StrCat(where, "shape ", ShapeString(entry.shape),
                                      " is too large: its strides overflow 64 bits"));
  }
  auto offsets = value.find("data_offsets");
  if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 ||
      !ToUint64((*offsets)[0], entry.begin) || !ToUint64((*offsets)[1], entry.end)) {
    return Corrupt(path, absl::StrCat(where,
                                      "data_offsets must be [begin, end] of "
                                      "non-negative integers"));
  }
  if (entry.begin > entry.end || entry.end > data_size) {
    return Corrupt(path, absl::StrFormat("%sdata_offsets [%d, %d] lie outside the data (%d bytes)",
                                         where, entry.begin, entry.end, data_size));
  }
  const uint64_t element = at::elementSize(entry.dtype);
  uint64_t bytes = 0;
  overflow = overflow || __builtin_mul_overflow(numel, element, &bytes);
  if (overflow || bytes != entry.end - entry.begin) {
    return Corrupt(path,
                   absl::StrFormat("%sdtype %s and shape %s need %s bytes, data_offsets [%d, %d] "
                                   "hold %d",
                                   where, dtype_name, ShapeString(entry.shape),
                                   overflow ? "more than 2^64" : std::to_string(bytes), entry.begin,
                                   entry.end, entry.end - entry.begin));
  }
  return entry;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  PLAIT_ASSIGN_OR_RETURN(const int fd, base::OpenForReading(path));
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat(path, ": cannot stat: ", std::strerror(error)));
  }
  const size_t size = static_cast<size_t>(info.st_size);
  if (size < kHeaderLengthBytes) {
    ::close(fd);
    return Corrupt(
        path, absl::StrCat("the file is ", size, " bytes, shorter than the 8-byte header length"));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int error = errno;
  ::close(fd);  // the mapping stays valid
  if (map == MAP_FAILED) {
    return absl::InternalError(absl::StrCat(path, ": cannot mmap: ", std::strerror(error)));
  }
  std::unique_ptr<SafetensorsFile> file(
      new SafetensorsFile(path, static_cast<const char*>(map), size));
  PLAIT_RETURN_IF_ERROR(file->ParseHeader());
  return file;
}

SafetensorsFile::~SafetensorsFile() { ::munmap(const_cast<char*>(map_), map_size_); }

absl::Status SafetensorsFile::ParseHeader() {
  uint64_t header_length = 0;
  for (size_t i = 0; i < kHeaderLengthBytes; ++i) {
    header_length |= static_cast<uint64_t>(static_cast<unsigned char>(map_[i])) << (8 * i);
  }
  if (header_length > map_size_ - kHeaderLengthBytes) {
    return Corrupt(path_,
                   absl::StrCat("header length ", header_length, " runs past the end of the file (",
                                map_size_ - kHeaderLengthBytes, " bytes follow it)"));
  }
  const char* header = map_ + kHeaderLengthBytes;
  data_ = header + header_length;
  const uint64_t data_size = map_size_ - kHeaderLengthBytes - header_length;
  PLAIT_ASSIGN_OR_RETURN(const Json json,
                         base::ParseJson(absl::StrCat(path_, ": the header"),
                                         absl::string_view(header, header_length)));
  if (!json.is_object()) return Corrupt(path_, "the header is not a JSON object");
  for (auto it = json.begin(); it != json.end(); ++it) {
    if (it.key() == kMetadataKey) {
      if (!it->is_object()) return Corrupt(path_, "__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          return Corrupt(path_,
                         absl::StrCat("__metadata__ value of \"", m.key(), "\" is not a string"));
        }
        metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    PLAIT_ASSIGN_OR_RETURN(SafetensorsEntry entry, ParseEntry(path_, it.key(), *it, data_size));
    entries_.emplace(it.key(), std::move(entry));
  }
  // Tensors must tile the data exactly: no overlaps and no unindexed bytes (the format's
  // rule; it is also what makes every read in bounds by construction).
  std::vector<std::pair<const std::string*, const SafetensorsEntry*>> by_offset;
  for (const auto& [name, entry] : entries_) by_offset.emplace_back(&name, &entry);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.second->begin, a.second->end) <
           std::make_pair(b.second->begin, b.second->end);
  });
  uint64_t covered = 0;
  const std::string* previous = nullptr;
  for (const auto& [name, entry] : by_offset) {
    if (entry->begin < covered) {
      return Corrupt(path_, absl::StrFormat("tensors \"%s\" and \"%s\" overlap (bytes [%d, %d) "
                                            "of the data)",
                                            *previous, *name, entry->begin, covered));
    }
    if (entry->begin > covered) {
      return Corrupt(
          path_, absl::StrFormat("data bytes [%d, %d) belong to no tensor", covered, entry->begin));
    }
    covered = entry->end;
    previous = name;
  }
  if (covered != data_size) {
    return Corrupt(path_,
                   absl::StrFormat("data bytes [%d, %d) belong to no tensor", covered, data_size));
  }
  return absl::OkStatus();
}

const char* SafetensorsDtypeName(at::ScalarType dtype) {
  for (const DtypeName& d : kDtypes) {
    if (d.dtype == dtype) return d.name;
  }
  return nullptr;
}

std::optional<at::ScalarType> SafetensorsDtypeOfName(absl::string_view name) {
  for (const DtypeName& d : kDtypes) {
    if (name == d.name) return d.dtype;
  }
  return std::nullopt;
}

absl::StatusOr<absl::string_view> SafetensorsFile::Bytes(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor \"", name, "\""));
  }
  return absl::string_view(data_ + it->second.begin, it->second.end - it->second.begin);
}

absl::StatusOr<at::Tensor> SafetensorsFile::Read(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor \"", name, "\""));
  }
  const SafetensorsEntry& entry = it->second;
  at::Tensor tensor = torch::empty(entry.shape, at::TensorOptions().dtype(entry.dtype));
  std::memcpy(tensor.data_ptr(), data_ + entry.begin, entry.end - entry.begin);
  return tensor;
}

absl::Status SafetensorsFile::ReadBox(const std::string& name, absl::Span<const int64_t> offsets,
                                      absl::Span<const int64_t> lengths,
                                      at::Tensor destination) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor \"", name, "\""));
  }
  const SafetensorsEntry& entry = it->second;
  const auto box_string = [&] {
    std::vector<std::string> ranges;
    for (size_t d = 0; d < offsets.size() && d < lengths.size(); ++d) {
      ranges.push_back(absl::StrCat(offsets[d], ":", offsets[d] + lengths[d]));
    }
    return absl::StrCat("[", absl::StrJoin(ranges, ", "), "]");
  };
  bool inside = offsets.size() == entry.shape.size() && lengths.size() == entry.shape.size();
  for (size_t d = 0; inside && d < entry.shape.size(); ++d) {
    inside = offsets[d] >= 0 && lengths[d] >= 0 && offsets[d] + lengths[d] <= entry.shape[d];
  }
  if (!inside) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor \"", name, "\" of shape [",
                                                   absl::StrJoin(entry.shape, ", "),
                                                   "] has no box ", box_string()));
  }
  if (destination.sizes() != at::IntArrayRef(lengths.data(), lengths.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": the box ", box_string(), " of tensor \"", name,
                     "\" cannot be read into a tensor of shape ", c10::str(destination.sizes())));
  }
  // A view of the mapping, never written: copying its narrowed box reads only the box's
  // elements.
  at::Tensor box = torch::from_blob(const_cast<char*>(data_ + entry.begin), entry.shape,
                                    at::TensorOptions().dtype(entry.dtype));
  for (size_t d = 0; d < entry.shape.size(); ++d) {
    box = box.narrow(static_cast<int64_t>(d), offsets[d], lengths[d]);
  }
  // The stored values, before a conversion that could overflow them.
  PLAIT_RETURN_IF_ERROR(CheckFinite(box, path_, name));
  at::NoGradGuard no_grad;
  // Staged in host memory, converted and contiguous, so that a device destination (a slice of
  // a CUDA parameter) takes one blocking host-to-device copy of exactly its bytes, done before
  // the staging tensor and the mapping can go, and every destination takes the same path.
  destination.copy_(box.to(destination.scalar_type()).contiguous());
  return absl::OkStatus();
}

absl::Status CheckFinite(const at::Tensor& values, absl::string_view path, absl::string_view name) {
  if (!at::isFloatingType(values.scalar_type()) || at::isfinite(values).all().item<bool>()) {
    return absl::OkStatus();
  }
  const char* held = at::isnan(values).any().item<bool>() ? "NaN" : "infinity";
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", name, ": holds ", held));
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::vector<at::Tensor> contiguous;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    const char* dtype = SafetensorsDtypeName(tensor.scalar_type());
    if (dtype == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor \"", name, "\" has dtype ",
                                                     c10::toString(tensor.scalar_type()),
                                                     "; supported: F32, BF16, F16, I64"));
    }
    if (name == kMetadataKey || header.contains(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor name \"", name, "\" is reserved or repeated"));
    }
    contiguous.push_back(tensor.detach().to(at::kCPU).contiguous());
    const uint64_t bytes = contiguous.back().nbytes();
    header[name] = {{"dtype", dtype},
                    {"shape", tensor.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((kHeaderAlignment - text.size() % kHeaderAlignment) % kHeaderAlignment, ' ');
  char length[kHeaderLengthBytes];
  for (size_t i = 0; i < kHeaderLengthBytes; ++i) {
    length[i] = static_cast<char>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xff);
  }
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) return absl::PermissionDeniedError(absl::StrCat(temporary, ": cannot create"));
    out.write(length, kHeaderLengthBytes);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const at::Tensor& tensor : contiguous) {
      out.write(static_cast<const char*>(tensor.data_ptr()),
                static_cast<std::streamsize>(tensor.nbytes()));
    }
    out.close();
    if (!out) {
      const std::string reason = std::strerror(errno);  // e.g. "No space left on device"
      std::remove(temporary.c_str());
      return absl::DataLossError(absl::StrCat(temporary, ": write failed: ", reason));
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat(path, ": cannot rename from ", temporary, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<SafetensorsCheckpoint> SafetensorsCheckpoint::Open(const std::string& dir) {
  SafetensorsCheckpoint checkpoint;
  checkpoint.dir_ = dir;
  const std::string index_path = absl::StrCat(dir, "/", kSafetensorsIndexName);
  if (::access(index_path.c_str(), F_OK) != 0) {
    PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                           SafetensorsFile::Open(absl::StrCat(dir, "/", kSafetensorsFileName)));
    for (const auto& [name, entry] : file->entries()) checkpoint.location_[name] = 0;
    checkpoint.files_.push_back(std::move(file));
    return checkpoint;
  }
  PLAIT_ASSIGN_OR_RETURN(std::string text, base::ReadFile(index_path));
  PLAIT_ASSIGN_OR_RETURN(const Json index, base::ParseJson(index_path, text));
  auto weight_map = index.is_object() ? index.find("weight_map") : index.end();
  if (!index.is_object() || weight_map == index.end() || !weight_map->is_object()) {
    return Corrupt(index_path, "expected an object with a \"weight_map\" object");
  }
  std::map<std::string, size_t> file_number;
  for (auto it = weight_map->begin(); it != weight_map->end(); ++it) {
    if (!it->is_string()) {
      return Corrupt(index_path, absl::StrCat("weight_map[\"", it.key(), "\"] is not a string"));
    }
    const std::string file_name = it->get<std::string>();
    if (file_name.empty() || file_name.find('/') != std::string::npos) {
      return Corrupt(index_path, absl::StrCat("weight_map[\"", it.key(), "\"] = \"", file_name,
                                              "\" is not a file name in the checkpoint folder"));
    }
    auto [slot, added] = file_number.emplace(file_name, checkpoint.files_.size());
    if (added) {
      PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                             SafetensorsFile::Open(absl::StrCat(dir, "/", file_name)));
      checkpoint.files_.push_back(std::move(file));
    }
    const SafetensorsFile& file = *checkpoint.files_[slot->second];
    if (file.entries().count(it.key()) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": missing tensor \"", it.key(),
                                                     "\": the index puts it in ", file.path(),
                                                     ", which does not hold it"));
    }
    checkpoint.location_[it.key()] = slot->second;
  }
  for (size_t i = 0; i < checkpoint.files_.size(); ++i) {
    for (const auto& [name, entry] : checkpoint.files_[i]->entries()) {
      auto where = checkpoint.location_.find(name);
      if (where == checkpoint.location_.end() || where->second != i) {
        return absl::InvalidArgumentError(
            absl::StrCat(checkpoint.files_[i]->path(), ": unexpected tensor \"", name,
                         "\": the index (", index_path, ") does not assign it to this file"));
      }
    }
  }
  return checkpoint;
}

std::vector<std::string> SafetensorsCheckpoint::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, file] : location_) names.push_back(name);
  return names;
}

absl::StatusOr<std::pair<const SafetensorsEntry*, const SafetensorsFile*>>
SafetensorsCheckpoint::Find(const std::string& name) const {
  auto it = location_.find(name);
  if (it == location_.end()) {
    return absl::NotFoundError(absl::StrCat(dir_, ": missing tensor \"", name, "\""));
  }
  const SafetensorsFile* file = files_[it->second].get();
  return std::make_pair(&file->entries().at(name), file);
}

absl::StatusOr<at::Tensor> SafetensorsCheckpoint::Read(const std::string& name) const {
  PLAIT_ASSIGN_OR_RETURN(auto found, Find(name));
  return found.second->Read(name);
}

absl::Status WriteSafetensorsCheckpoint(
    const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
    uint64_t max_shard_bytes) {
  // Hugging Face's writers tag each file with the framework it came from; plait adds itself.
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {kWriterKey, kWriterPlait}};
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> shards(1);
  uint64_t shard_bytes = 0, total_bytes = 0;
  for (const auto& item : tensors) {
    const uint64_t bytes = item.second.nbytes();
    if (max_shard_bytes > 0 && !shards.back().empty() && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(item);
    shard_bytes += bytes;
    total_bytes += bytes;
  }
  const std::string index_path = absl::StrCat(dir, "/", kSafetensorsIndexName);
  if (shards.size() == 1) {
    PLAIT_RETURN_IF_ERROR(
        WriteSafetensors(absl::StrCat(dir, "/", kSafetensorsFileName), tensors, metadata));
    // An index left by an earlier sharded save would take precedence over the new file.
    std::error_code error;
    std::filesystem::remove(index_path, error);
    if (error) {
      return absl::DataLossError(
          absl::StrCat(index_path, ": cannot remove the stale index: ", error.message()));
    }
    return absl::OkStatus();
  }
  Json weight_map = Json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file_name =
        absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, shards.size());
    PLAIT_RETURN_IF_ERROR(WriteSafetensors(absl::StrCat(dir, "/", file_name), shards[i], metadata));
    for (const auto& item : shards[i]) weight_map[item.first] = file_name;
  }
  const Json index = {{"metadata", {{"total_size", total_bytes}, {kWriterKey, kWriterPlait}}},
                      {"weight_map", weight_map}};
  // Replaced atomically, like the shards, so a crash never leaves a half-written index.
  return base::WriteFileAtomically(index_path, index.dump(2) + "\n");
}

}  // namespace plait::models
