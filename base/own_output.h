// Where a tool or a job writes, checked before it does any work: the one rule every plait
// binary that writes follows. A path is written only when it is new, or when it holds what
// the same writer wrote there earlier, recognised by the writer's own test (a marker in the
// file, a list the writer keeps); anything else is refused, naming the path and why, so no
// file of the user's is ever replaced:
//
//   PLAIT_ASSIGN_OR_RETURN(std::vector<std::string> earlier,
//                          base::CheckOutputFolder(dir, IsEarlierExport, "a plait export"));
//   // "\"/models/llama\" holds \"tokenizer.json\", which a plait export did not write: choose
//   //  a new or empty folder"
//
// A job that writes several outputs and reads inputs checks them apart first, so that one
// output never overwrites another or what the job reads (CheckOutputsApart):
//
//   AddAll(base::CheckOutputsApart({{"plan.training.save_hf_dir", dir, /*whole_folder=*/true}},
//                                  {{"plan.hf_weights_dir", weights}}));
#ifndef PLAIT_BASE_OWN_OUTPUT_H_
#define PLAIT_BASE_OWN_OUTPUT_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/violation.h"

namespace plait::base {

// Whether the existing regular file at `path` is the writer's own earlier output.
using IsOwnOutput = std::function<bool(const std::string& path)>;

// OK when the folder `dir` is missing (and can be created) or is a writable folder whose
// every entry is a regular file `is_own` recognises; then the paths of those earlier files,
// which the writer replaces (and says so). FailedPrecondition otherwise, naming `dir` and
// the first entry that is not its own, which `writer` ("a plait export") did not write.
absl::StatusOr<std::vector<std::string>> CheckOutputFolder(const std::string& dir,
                                                           const IsOwnOutput& is_own,
                                                           absl::string_view writer);

// OK when the file `path` is missing (and its folder can be written) or is a regular file
// `is_own` recognises; then whether it exists. FailedPrecondition otherwise, naming `path`
// and what it is.
absl::StatusOr<bool> CheckOutputFile(const std::string& path, const IsOwnOutput& is_own,
                                     absl::string_view writer);

// A path a job writes or reads, with what names it: a config field ("plan.hf_weights_dir") or
// a command-line argument ("OUT_DIR").
struct NamedPath {
  std::string field;
  std::string path;
  // For an output: a folder whose writer refuses every entry it did not write there itself
  // (CheckOutputFolder), so that no other output may lie inside it.
  bool whole_folder = false;
};

// `path` as the file system reaches it: absolute, each symbolic link on the way replaced by its
// target, a dangling one's included (a writer would follow it), and "." and ".." taken out; so
// two spellings of one place give one string. Links are followed at most 40 deep (the kernel's
// own limit), then the path is taken as it stands.
std::string ResolvedPath(const std::string& path);

// Every way the paths of `outputs` would destroy files of the job, each a violation under the
// output's field naming the other field and both paths: an output that is another output's
// place, or lies inside another's whole_folder; an output that is one of `inputs`, which
// writing would overwrite. Compared as ResolvedPath gives them; empty paths are skipped.
std::vector<Violation> CheckOutputsApart(const std::vector<NamedPath>& outputs,
                                         const std::vector<NamedPath>& inputs);

}  // namespace plait::base

#endif  // PLAIT_BASE_OWN_OUTPUT_H_
