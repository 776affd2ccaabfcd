// The manifest of one checkpoint folder (checkpoint.json) and reading tensors back from the
// folder's rank files by it, for a run on any layout and for tools. Every tensor is saved
// under its global name, dtype and shape as slices (boxes of the global tensor, each in one
// rank file, padding never saved); the manifest lists, per tensor, which file holds which
// slice and the slice's checksum, so a reader reads only the slices, and the parts of them,
// that it needs (from memory-mapped files: only the pages touched are read).
//
//   PLAIT_ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(folder + "/checkpoint.json"));
//   SliceReader reader(folder, manifest);
//   at::Tensor rows = torch::empty({64, 256});  // rows 64..127 of "param/w"
//   PLAIT_RETURN_IF_ERROR(reader.Read("param/w", parallel::Box{{64, 0}, {64, 256}}, rows));
#ifndef PLAIT_CHECKPOINT_MANIFEST_H_
#define PLAIT_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/safetensors.h"
#include "nlohmann/json.hpp"
#include "parallel/tensor_slice.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::checkpoint {

// Written into every manifest and rank file, so a future layout can tell this one apart.
inline constexpr char kFormat[] = "plait-checkpoint-2";

// One slice of a tensor as saved: the rank file holding it (under the tensor's name, shaped
// as the box) and the checksum of its bytes.
struct StoredSlice {
  std::string file;  // a name in the checkpoint folder
  parallel::Box box;
  std::string checksum;
};

// One tensor of a checkpoint: its dtype, global shape, and the slices that tile it.
struct StoredTensor {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  std::vector<StoredSlice> slices;
};

struct Manifest {
  std::string path;  // of checkpoint.json
  int64_t step = 0;
  int64_t world_size = 0;     // of the run that saved it
  std::string mesh;           // "dp=2 x tp=2"
  std::string layout;         // the saving run's preparation, as its caller described it
  int64_t data_position = 0;  // the caller's position ("sequences consumed")
  // What a resume must not change, by the caller's field path; entries that are not
  // strings are left out (a resume then finds them missing).
  std::map<std::string, std::string> fingerprint;
  std::map<std::string, std::string> metadata;  // the caller's, the same on every rank
  std::map<std::string, StoredTensor> tensors;
};

// A 64-bit FNV-1a over `bytes`, as hex: cheap next to writing them, and it catches bytes
// changed after the header was checked.
std::string Checksum(absl::string_view bytes);

// Reads and checks the manifest at `path`: every field of the right type, every tensor's
// slices inside its shape and tiling it exactly (no element missing or saved twice), every
// file a plain name. DataLoss (NotFound for a missing file) naming `path` and the field.
absl::StatusOr<Manifest> ReadManifest(const std::string& path);

// `manifest` as the JSON written to checkpoint.json.
nlohmann::json ManifestJson(const Manifest& manifest);

// Reads boxes of a checkpoint's tensors from its rank files, opening (mapping) each file once
// and checking each slice it reads from (the entry's dtype and shape, its checksum, and that
// its values are finite: models::CheckFinite) once. Errors name the manifest, the tensor's
// field and the file; a NaN or an infinity names the file and the tensor.
class SliceReader {
 public:
  // `manifest` must outlive the reader.
  SliceReader(std::string folder, const Manifest& manifest)
      : folder_(std::move(folder)), manifest_(manifest) {}

  // Fills `into` (shaped as `box`, any dtype: values are converted) with the box `box` of
  // tensor `name`, which must be in the manifest.
  absl::Status Read(const std::string& name, const parallel::Box& box, at::Tensor into);

  // The whole tensor `name`, which must be in the manifest, assembled from its slices.
  absl::StatusOr<at::Tensor> ReadWhole(const std::string& name);

  // Checks the checksum and the values of every slice of every tensor (reading every byte).
  absl::Status VerifyAll();

 private:
  // The data of slice `index` of `name`, checked, as a tensor over the mapped file.
  absl::StatusOr<at::Tensor> SliceData(const std::string& name, size_t index);

  std::string folder_;
  const Manifest& manifest_;
  std::map<std::string, std::unique_ptr<models::SafetensorsFile>> files_;
  std::set<std::pair<std::string, size_t>> verified_;
};

}  // namespace plait::checkpoint

#endif  // PLAIT_CHECKPOINT_MANIFEST_H_
