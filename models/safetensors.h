// Reading and writing the safetensors format (https://github.com/huggingface/safetensors):
// an 8-byte little-endian header length N, N bytes of JSON mapping each tensor name to its
// dtype, shape and [begin, end) byte offsets into the data that follows (plus an optional
// "__metadata__" object of strings), then the data. Files are memory-mapped; every offset,
// size and type in the header is checked before any byte is read, so a corrupt or hostile
// file is an error naming the file and the problem, never a crash. Also the sharded layout
// Hugging Face writes for large models: `model.safetensors.index.json` mapping each tensor
// to one of several files.
//
//   PLAIT_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open("/ckpt/model.safetensors"));
//   PLAIT_ASSIGN_OR_RETURN(at::Tensor embed, file->Read("model.embed_tokens.weight"));
//   PLAIT_RETURN_IF_ERROR(WriteSafetensors("/out/model.safetensors", {{"w", w}}));
//
// Supported dtypes: F32, BF16, F16 and I64.
#ifndef PLAIT_MODELS_SAFETENSORS_H_
#define PLAIT_MODELS_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace plait::models {

// The file a sharded checkpoint's index lives in (Hugging Face's name).
inline constexpr char kSafetensorsIndexName[] = "model.safetensors.index.json";
// The single-file checkpoint name Hugging Face uses.
inline constexpr char kSafetensorsFileName[] = "model.safetensors";
// WriteSafetensorsCheckpoint marks each file it writes with "writer": "plait" in its
// "__metadata__" (and its index in the index's "metadata"), so that a later export knows
// them as its own earlier output, never as the files of a model downloaded into that folder.
inline constexpr char kWriterKey[] = "writer";
inline constexpr char kWriterPlait[] = "plait";

// The header's name of `dtype` ("F32"); nullptr for a dtype the format does not support.
const char* SafetensorsDtypeName(at::ScalarType dtype);
// The dtype of a header's name ("BF16"); nullopt for any other name.
std::optional<at::ScalarType> SafetensorsDtypeOfName(absl::string_view name);

// One tensor's entry in a safetensors header.
struct SafetensorsEntry {
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin;  // byte offsets into the data section
  uint64_t end;
};

// A memory-mapped safetensors file whose header has been checked.
class SafetensorsFile {
 public:
  // Maps and checks `path`. Errors (InvalidArgument unless the file cannot be opened) name
  // the file and the problem: a file shorter than 8 bytes, a header length past the end of
  // the file, a header that is not valid JSON or not an object, an entry without a valid
  // dtype, shape or data_offsets, an unsupported dtype, offsets outside the data, a size that
  // does not match dtype and shape, overlapping tensors, or data bytes that belong to no
  // tensor.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // A copy of the tensor `name` in a new CPU tensor of its dtype; NotFound naming the file
  // when there is no such tensor.
  absl::StatusOr<at::Tensor> Read(const std::string& name) const;

  // Copies the box of the tensor `name` that starts at `offsets` and spans `lengths` (one of
  // each per dimension) into `destination`, a tensor of the box's shape of any float dtype
  // and device, converting the dtype. Only the box's elements are read from the mapped file,
  // so a rank that holds a slice of a parameter (tensor parallelism, FSDP) touches only the
  // pages of its slice. NotFound naming the file when there is no such tensor;
  // InvalidArgument naming the file and the tensor when the box leaves the tensor or
  // `destination` is shaped otherwise, or when the box holds NaN or infinity (CheckFinite).
  absl::Status ReadBox(const std::string& name, absl::Span<const int64_t> offsets,
                       absl::Span<const int64_t> lengths, at::Tensor destination) const;

  // The bytes of the tensor `name` in the mapped file (row-major, its entry's dtype and
  // shape), valid while this object lives: a reader of part of a tensor touches only the
  // pages it reads. NotFound naming the file when there is no such tensor.
  absl::StatusOr<absl::string_view> Bytes(const std::string& name) const;

 private:
  SafetensorsFile(std::string path, const char* data, size_t size)
      : path_(std::move(path)), map_(data), map_size_(size) {}
  absl::Status ParseHeader();

  std::string path_;
  const char* map_;
  size_t map_size_;
  const char* data_ = nullptr;  // start of the data section
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// OK when every value of `values`, read from the tensor `name` of the file `path`, is finite
// (an integer tensor's always are); otherwise InvalidArgument "`path`: `name`: holds NaN" (or
// "holds infinity"): weights that a diverged run saved are refused where they are loaded, not
// trained on. One pass over `values` when they are all finite.
absl::Status CheckFinite(const at::Tensor& values, absl::string_view path, absl::string_view name);

// Writes `tensors` (CPU or not, any layout; F32, BF16, F16 or I64) in the given order, with
// `metadata` as "__metadata__", to `path` through a temporary file renamed into place.
// InvalidArgument naming the tensor for an unsupported dtype or a duplicate name.
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// The tensors of a checkpoint directory: either one `model.safetensors`, or the files that
// `model.safetensors.index.json` names.
class SafetensorsCheckpoint {
 public:
  // Opens `dir`'s index if it has one (every file it names is opened and must hold exactly
  // the tensors the index assigns to it), else `dir/model.safetensors`.
  static absl::StatusOr<SafetensorsCheckpoint> Open(const std::string& dir);

  // Every tensor name, sorted.
  std::vector<std::string> Names() const;
  bool Contains(const std::string& name) const { return location_.count(name) > 0; }
  // The entry and the file holding `name`; NotFound when absent.
  absl::StatusOr<std::pair<const SafetensorsEntry*, const SafetensorsFile*>> Find(
      const std::string& name) const;
  absl::StatusOr<at::Tensor> Read(const std::string& name) const;

 private:
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> location_;  // name -> index into files_
  std::string dir_;
};

// Writes `tensors` into `dir` as Hugging Face does: one model.safetensors when their data
// fits in `max_shard_bytes` (or it is 0), else files `model-0000i-of-0000n.safetensors` of at
// most that many bytes each (a larger single tensor gets a file of its own) and the index.
absl::Status WriteSafetensorsCheckpoint(
    const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
    uint64_t max_shard_bytes = 0);

}  // namespace plait::models

#endif  // PLAIT_MODELS_SAFETENSORS_H_
