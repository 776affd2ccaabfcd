#include "checkpoint/manifest.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/file.h"
#include "base/hash.h"
#include "base/json.h"
#include "base/status.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::checkpoint {
namespace {

using Json = nlohmann::json;

// Larger than any tensor dimension, small enough that a sum of two never overflows.
constexpr int64_t kMaxExtent = int64_t{1} << 60;

absl::Status Corrupt(const std::string& path, const std::string& field,
                     const std::string& problem) {
  return absl::DataLossError(
      absl::StrCat(path, ": ", field, ": ", problem, "; the file is corrupt"));
}

// The entries of the object `field` whose values are strings (all of them when `strict`).
absl::StatusOr<std::map<std::string, std::string>> StringMap(const Json& json, const char* field,
                                                             const std::string& path, bool strict) {
  std::map<std::string, std::string> values;
  const auto it = json.find(field);
  if (it == json.end() || !it->is_object()) {
    if (!strict) return values;
    return Corrupt(path, field, "missing or not an object");
  }
  for (auto entry = it->begin(); entry != it->end(); ++entry) {
    if (entry->is_string()) {
      values[entry.key()] = entry->get<std::string>();
    } else if (strict) {
      return Corrupt(path, absl::StrCat(field, ".", entry.key()),
                     absl::StrCat("expected a string, got ", base::DescribeJson(*entry)));
    }
  }
  return values;
}

// The fields of `object`, the value at `field` of the manifest `path`.
base::JsonFields FieldsOf(const Json& object, const std::string& path, const std::string& field) {
  return base::JsonFields(object, absl::StrCat(path, ": ", field), base::JsonAuthor::kPlait);
}

// An array of integers in [min, kMaxExtent] of `size` entries (any size when negative).
absl::StatusOr<std::vector<int64_t>> Extents(const Json& json, const char* key,
                                             const std::string& path, const std::string& field,
                                             int64_t size, int64_t min) {
  const std::string where = absl::StrCat(field, ".", key);
  const auto it = json.find(key);
  if (it == json.end() || !it->is_array()) return Corrupt(path, where, "missing or not an array");
  const base::JsonFields fields(*it, path, base::JsonAuthor::kPlait);
  if (size >= 0 && static_cast<int64_t>(it->size()) != size) {
    return Corrupt(path, where, absl::StrCat(it->size(), " entries, ", size, " expected"));
  }
  std::vector<int64_t> values;
  for (size_t i = 0; i < it->size(); ++i) {
    const std::string at = absl::StrCat(where, "[", i, "]");
    PLAIT_ASSIGN_OR_RETURN(const int64_t value, fields.IntValue((*it)[i], at));
    if (value < min || value > kMaxExtent) {
      return Corrupt(path, at, absl::StrCat(value, " is outside [", min, ", 2^60]"));
    }
    values.push_back(value);
  }
  return values;
}

absl::StatusOr<StoredTensor> ParseTensor(const Json& json, const std::string& path,
                                         const std::string& field) {
  if (!json.is_object()) return Corrupt(path, field, "not an object");
  StoredTensor tensor;
  PLAIT_ASSIGN_OR_RETURN(const std::string dtype, FieldsOf(json, path, field).String("dtype"));
  const std::optional<at::ScalarType> known = models::SafetensorsDtypeOfName(dtype);
  if (!known.has_value()) {
    return Corrupt(path, field + ".dtype",
                   absl::StrCat("\"", dtype, "\" is not F32, BF16, F16 or I64"));
  }
  tensor.dtype = *known;
  PLAIT_ASSIGN_OR_RETURN(tensor.shape, Extents(json, "shape", path, field, -1, 0));
  const int64_t dims = static_cast<int64_t>(tensor.shape.size());
  int64_t elements = 1;
  for (const int64_t extent : tensor.shape) {
    if (__builtin_mul_overflow(elements, extent, &elements)) {
      return Corrupt(path, field + ".shape", "more than 2^63 - 1 elements");
    }
  }
  const auto slices = json.find("slices");
  if (slices == json.end() || !slices->is_array()) {
    return Corrupt(path, field + ".slices", "missing or not an array");
  }
  int64_t covered = 0;
  for (size_t i = 0; i < slices->size(); ++i) {
    const std::string at = absl::StrCat(field, ".slices[", i, "]");
    const Json& value = (*slices)[i];
    if (!value.is_object()) return Corrupt(path, at, "not an object");
    StoredSlice slice;
    const base::JsonFields slice_fields = FieldsOf(value, path, at);
    PLAIT_ASSIGN_OR_RETURN(slice.file, slice_fields.String("file"));
    if (slice.file.empty() || slice.file == "." || slice.file == ".." ||
        slice.file.find('/') != std::string::npos) {
      return Corrupt(path, at + ".file",
                     absl::StrCat("\"", slice.file, "\" is not a file name in the folder"));
    }
    PLAIT_ASSIGN_OR_RETURN(slice.box.offsets, Extents(value, "offsets", path, at, dims, 0));
    PLAIT_ASSIGN_OR_RETURN(slice.box.lengths, Extents(value, "lengths", path, at, dims, 1));
    for (int64_t d = 0; d < dims; ++d) {
      if (slice.box.offsets[d] + slice.box.lengths[d] > tensor.shape[d]) {
        return Corrupt(
            path, at,
            absl::StrCat("dimension ", d, " ends at ", slice.box.offsets[d] + slice.box.lengths[d],
                         ", past the tensor's ", tensor.shape[d]));
      }
    }
    PLAIT_ASSIGN_OR_RETURN(slice.checksum, slice_fields.String("checksum"));
    for (size_t j = 0; j < tensor.slices.size(); ++j) {
      if (parallel::Intersect(tensor.slices[j].box, slice.box).has_value()) {
        return Corrupt(path, at, absl::StrCat("overlaps slices[", j, "]"));
      }
    }
    covered += slice.box.numel();  // disjoint boxes inside the shape: at most `elements`
    tensor.slices.push_back(std::move(slice));
  }
  if (covered != elements) {
    return Corrupt(path, field + ".slices",
                   absl::StrCat("they hold ", covered, " of the tensor's ", elements, " elements"));
  }
  return tensor;
}

}  // namespace

std::string Checksum(absl::string_view bytes) {
  return absl::StrFormat("%016x",
                         base::Fnv1a64Words(base::kFnv1a64OffsetBasis, bytes.data(), bytes.size()));
}

absl::StatusOr<Manifest> ReadManifest(const std::string& path) {
  absl::StatusOr<std::string> text = base::ReadFile(path);
  if (!text.ok()) return absl::NotFoundError(absl::StrCat(path, ": missing or unreadable"));
  const absl::StatusOr<Json> parsed = base::ParseJson(path, *text);
  if (!parsed.ok() || !parsed->is_object()) {
    return absl::DataLossError(absl::StrCat(path, ": not a JSON object; the file is corrupt"));
  }
  const Json& json = *parsed;
  // The manifest's values are read where they are, never copied or written out whole: a
  // corrupt one can be nested deep enough that either would overflow the stack.
  const auto format = json.find("format");
  if (format == json.end() || *format != kFormat) {
    return absl::DataLossError(absl::StrCat(
        path, ": format: ", format == json.end() ? "(none)" : base::DescribeJson(*format),
        " in the file, \"", kFormat, "\" expected"));
  }
  Manifest manifest;
  manifest.path = path;
  const base::JsonFields fields(json, path, base::JsonAuthor::kPlait);
  PLAIT_ASSIGN_OR_RETURN(manifest.step, fields.Int("step"));
  PLAIT_ASSIGN_OR_RETURN(manifest.world_size, fields.Int("world_size"));
  PLAIT_ASSIGN_OR_RETURN(manifest.data_position, fields.Int("data_position"));
  PLAIT_ASSIGN_OR_RETURN(manifest.mesh, fields.String("mesh"));
  PLAIT_ASSIGN_OR_RETURN(manifest.layout, fields.String("layout"));
  PLAIT_ASSIGN_OR_RETURN(manifest.fingerprint,
                         StringMap(json, "fingerprint", path, /*strict=*/false));
  PLAIT_ASSIGN_OR_RETURN(manifest.metadata, StringMap(json, "metadata", path, /*strict=*/true));
  const auto tensors = json.find("tensors");
  if (tensors == json.end() || !tensors->is_object()) {
    return Corrupt(path, "tensors", "missing or not an object");
  }
  for (auto it = tensors->begin(); it != tensors->end(); ++it) {
    PLAIT_ASSIGN_OR_RETURN(manifest.tensors[it.key()],
                           ParseTensor(*it, path, absl::StrCat("tensors.", it.key())));
  }
  return manifest;
}

Json ManifestJson(const Manifest& manifest) {
  Json tensors = Json::object();
  for (const auto& [name, tensor] : manifest.tensors) {
    Json slices = Json::array();
    for (const StoredSlice& slice : tensor.slices) {
      slices.push_back({{"file", slice.file},
                        {"offsets", slice.box.offsets},
                        {"lengths", slice.box.lengths},
                        {"checksum", slice.checksum}});
    }
    tensors[name] = {{"dtype", models::SafetensorsDtypeName(tensor.dtype)},
                     {"shape", tensor.shape},
                     {"slices", std::move(slices)}};
  }
  return {{"format", kFormat},
          {"step", manifest.step},
          {"world_size", manifest.world_size},
          {"mesh", manifest.mesh},
          {"layout", manifest.layout},
          {"data_position", manifest.data_position},
          {"fingerprint", manifest.fingerprint},
          {"metadata", manifest.metadata},
          {"tensors", std::move(tensors)}};
}

absl::StatusOr<at::Tensor> SliceReader::SliceData(const std::string& name, size_t index) {
  const StoredTensor& tensor = manifest_.tensors.at(name);
  const StoredSlice& slice = tensor.slices[index];
  const std::string field =
      absl::StrCat(manifest_.path, ": tensors.", name, ".slices[", index, "]");
  const std::string path = absl::StrCat(folder_, "/", slice.file);
  std::unique_ptr<models::SafetensorsFile>& file = files_[slice.file];
  if (file == nullptr) {
    absl::StatusOr<std::unique_ptr<models::SafetensorsFile>> opened =
        models::SafetensorsFile::Open(path);
    if (!opened.ok()) {
      files_.erase(slice.file);
      return base::Annotate(opened.status(), field + ".file");
    }
    file = *std::move(opened);
  }
  const auto entry = file->entries().find(name);
  if (entry == file->entries().end()) {
    return absl::DataLossError(absl::StrCat(field, ": ", path, " has no tensor \"", name,
                                            "\"; the checkpoint is corrupt"));
  }
  if (entry->second.dtype != tensor.dtype || entry->second.shape != slice.box.lengths) {
    return absl::DataLossError(
        absl::StrCat(field, ": ", path, " holds it as ", c10::toString(entry->second.dtype), " [",
                     absl::StrJoin(entry->second.shape, ", "), "], the manifest says ",
                     c10::toString(tensor.dtype), " [", absl::StrJoin(slice.box.lengths, ", "),
                     "]; the checkpoint is corrupt"));
  }
  PLAIT_ASSIGN_OR_RETURN(const absl::string_view bytes, file->Bytes(name));
  const auto options = at::TensorOptions().dtype(tensor.dtype);
  at::Tensor data = torch::from_blob(const_cast<char*>(bytes.data()), slice.box.lengths, options);
  // Entries of several dtypes in one file need not be aligned for each one's elements.
  if (reinterpret_cast<uintptr_t>(bytes.data()) % data.element_size() != 0) {
    data = torch::empty(slice.box.lengths, options);
    std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
  }
  if (verified_.count({name, index}) == 0) {
    if (const std::string computed = Checksum(bytes); computed != slice.checksum) {
      return absl::DataLossError(absl::StrCat(field, ".checksum: ", slice.checksum,
                                              " in the manifest, ", computed, " computed from ",
                                              path, "; the checkpoint is corrupt"));
    }
    // Intact, but saved by a run that had diverged.
    PLAIT_RETURN_IF_ERROR(models::CheckFinite(data, path, name));
    verified_.insert({name, index});
  }
  return data;
}

absl::Status SliceReader::Read(const std::string& name, const parallel::Box& box, at::Tensor into) {
  const StoredTensor& tensor = manifest_.tensors.at(name);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < tensor.slices.size(); ++i) {
    const std::optional<parallel::Box> common = parallel::Intersect(tensor.slices[i].box, box);
    if (!common.has_value()) continue;
    PLAIT_ASSIGN_OR_RETURN(const at::Tensor data, SliceData(name, i));
    parallel::NarrowTo(into, box, *common)
        .copy_(parallel::NarrowTo(data, tensor.slices[i].box, *common));
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> SliceReader::ReadWhole(const std::string& name) {
  const StoredTensor& tensor = manifest_.tensors.at(name);
  at::Tensor whole = torch::empty(tensor.shape, at::TensorOptions().dtype(tensor.dtype));
  PLAIT_RETURN_IF_ERROR(Read(name, parallel::TensorSlice::Whole(tensor.shape).box, whole));
  return whole;
}

absl::Status SliceReader::VerifyAll() {
  for (const auto& [name, tensor] : manifest_.tensors) {
    for (size_t i = 0; i < tensor.slices.size(); ++i) {
      PLAIT_RETURN_IF_ERROR(SliceData(name, i).status());
    }
  }
  return absl::OkStatus();
}

}  // namespace plait::checkpoint
