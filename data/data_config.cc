#include "data/data_config.h"

#include <sys/stat.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/file.h"

namespace plait::data {

DataConfig ResolvedDataConfig(const DataConfig& data) {
  DataConfig resolved = data;
  if (resolved.source_case() == DataConfig::SOURCE_NOT_SET) resolved.mutable_synthetic();
  if (resolved.has_synthetic()) {
    SyntheticData& synthetic = *resolved.mutable_synthetic();
    if (!synthetic.has_num_states()) synthetic.set_num_states(kDefaultNumStates);
    if (!synthetic.has_branching()) synthetic.set_branching(kDefaultBranching);
    if (!synthetic.has_peak()) synthetic.set_peak(kDefaultPeak);
  }
  return resolved;
}

std::vector<base::Violation> ValidateDataConfig(const DataConfig& data,
                                                std::optional<int64_t> vocab_size,
                                                absl::string_view field_path) {
  std::vector<base::Violation> problems;
  auto add = [&](absl::string_view field, std::string message) {
    problems.push_back({absl::StrCat(field_path, ".", field), std::move(message), ""});
  };
  const DataConfig resolved = ResolvedDataConfig(data);
  if (resolved.has_synthetic()) {
    const SyntheticData& s = resolved.synthetic();
    if (s.num_states() < 2 || (vocab_size.has_value() && s.num_states() > *vocab_size)) {
      add("synthetic.num_states",
          absl::StrCat(s.num_states(), "; must be in [2, vocab_size",
                       vocab_size.has_value() ? absl::StrCat(" = ", *vocab_size) : "", "]"));
    }
    if (s.branching() < 1 || s.branching() > s.num_states()) {
      add("synthetic.branching",
          absl::StrCat(s.branching(), "; must be in [1, num_states = ", s.num_states(), "]"));
    }
    if (!(s.peak() >= 1.0)) add("synthetic.peak", absl::StrCat(s.peak(), "; must be >= 1"));
    return problems;
  }
  const TokenFiles& files = resolved.token_files();
  if (files.format() == TOKEN_FORMAT_UNSPECIFIED) {
    add("token_files.format",
        "is not set; set TOKEN_FORMAT_LLMC, TOKEN_FORMAT_UINT16 or TOKEN_FORMAT_UINT32");
  }
  for (const auto& [name, path] :
       {std::pair<std::string, std::string>{"train_path", files.train_path()},
        {"eval_path", files.eval_path()}}) {
    if (path.empty()) {
      add("token_files." + name, "is empty; name a token file");
    } else if (struct stat info; stat(path.c_str(), &info) != 0) {
      add("token_files." + name, absl::StrCat("\"", path, "\" does not exist"));
    } else if (!S_ISREG(info.st_mode)) {
      add("token_files." + name,
          absl::StrCat("\"", path, "\" is ", base::FileKind(info.st_mode), ", not a token file"));
    }
  }
  return problems;
}

}  // namespace plait::data
