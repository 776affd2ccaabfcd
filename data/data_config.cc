#include "data/data_config.h"

#include <sys/stat.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/file.h"

namespace plait::data {

namespace {

void FillDefaults(SyntheticData& synthetic) {
  if (!synthetic.has_num_states()) synthetic.set_num_states(kDefaultNumStates);
  if (!synthetic.has_branching()) synthetic.set_branching(kDefaultBranching);
  if (!synthetic.has_peak()) synthetic.set_peak(kDefaultPeak);
}

}  // namespace

DataConfig ResolvedDataConfig(const DataConfig& data) {
  DataConfig resolved = data;
  if (resolved.source_case() == DataConfig::SOURCE_NOT_SET) resolved.mutable_synthetic();
  if (resolved.has_synthetic()) FillDefaults(*resolved.mutable_synthetic());
  if (resolved.has_synthetic_pairs())
    FillDefaults(*resolved.mutable_synthetic_pairs()->mutable_chain());
  if (resolved.has_synthetic_sft())
    FillDefaults(*resolved.mutable_synthetic_sft()->mutable_chain());
  return resolved;
}

std::vector<base::Violation> CheckDataConfig(const DataConfig& data,
                                                std::optional<int64_t> vocab_size,
                                                absl::string_view field_path) {
  std::vector<base::Violation> problems;
  auto add = [&](absl::string_view field, std::string message) {
    problems.push_back({absl::StrCat(field_path, ".", field), std::move(message), ""});
  };
  auto check_chain = [&](const SyntheticData& s, const std::string& field) {
    if (s.num_states() < 2 || (vocab_size.has_value() && s.num_states() > *vocab_size)) {
      add(field + ".num_states",
          absl::StrCat(s.num_states(), "; must be in [2, vocab_size",
                       vocab_size.has_value() ? absl::StrCat(" = ", *vocab_size) : "", "]"));
    }
    if (s.branching() < 1 || s.branching() > s.num_states()) {
      add(field + ".branching",
          absl::StrCat(s.branching(), "; must be in [1, num_states = ", s.num_states(), "]"));
    }
    if (!(s.peak() >= 1.0)) add(field + ".peak", absl::StrCat(s.peak(), "; must be >= 1"));
  };
  auto check_files = [&](const std::string& field, const std::string& train,
                         const std::string& eval, absl::string_view kind) {
    for (const auto& [name, path] :
         {std::pair<std::string, std::string>{"train_path", train}, {"eval_path", eval}}) {
      if (path.empty()) {
        add(field + name, absl::StrCat("is empty; name a ", kind));
      } else if (struct stat info; stat(path.c_str(), &info) != 0) {
        add(field + name, absl::StrCat("\"", path, "\" does not exist"));
      } else if (!S_ISREG(info.st_mode)) {
        add(field + name,
            absl::StrCat("\"", path, "\" is ", base::FileKind(info.st_mode), ", not a ", kind));
      }
    }
  };
  const DataConfig resolved = ResolvedDataConfig(data);
  switch (resolved.source_case()) {
    case DataConfig::kSynthetic:
      check_chain(resolved.synthetic(), "synthetic");
      break;
    case DataConfig::kSyntheticPairs:
    case DataConfig::kSyntheticSft: {
      const bool sft = resolved.has_synthetic_sft();
      const SyntheticPairs& pairs = sft ? resolved.synthetic_sft() : resolved.synthetic_pairs();
      const std::string field = sft ? "synthetic_sft." : "synthetic_pairs.";
      check_chain(pairs.chain(), field + "chain");
      if (pairs.prompt_length() < 1) {
        add(field + "prompt_length", absl::StrCat(pairs.prompt_length(), "; must be >= 1"));
      }
      break;
    }
    case DataConfig::kPreferenceFiles:
    case DataConfig::kSftFiles: {
      const bool sft = resolved.has_sft_files();
      const PairFiles& files = sft ? resolved.sft_files() : resolved.preference_files();
      const std::string field = sft ? "sft_files." : "preference_files.";
      check_files(field, files.train_path(), files.eval_path(), "JSONL file of examples");
      if (files.format() == PAIR_FORMAT_TEXT && files.tokenizer().empty()) {
        add(field + "tokenizer",
            "is empty; text examples need the model's tokenizer: name its folder (with "
            "tokenizer.json or tokenizer.model) or file, or read the model from a Hugging Face "
            "folder, whose tokenizer is then used");
      } else if (files.format() == PAIR_FORMAT_TEXT) {
        if (struct stat info; stat(files.tokenizer().c_str(), &info) != 0) {
          add(field + "tokenizer", absl::StrCat("\"", files.tokenizer(), "\" does not exist"));
        }
      } else if (!files.tokenizer().empty()) {
        add(field + "tokenizer",
            absl::StrCat("\"", files.tokenizer(),
                         "\" is named, but format is PAIR_FORMAT_IDS, which reads token ids; set "
                         "format: PAIR_FORMAT_TEXT for text examples"));
      }
      if (files.max_prompt_length() < 0) {
        add(field + "max_prompt_length",
            absl::StrCat(files.max_prompt_length(), "; must be >= 0 (0: not cut)"));
      }
      if (!sft && files.packing() == PACKING_BFD) {
        add(field + "packing",
            "PACKING_BFD packs SFT examples only: a preference pair's chosen and rejected "
            "sequences must share a micro-batch, which rows packed over the whole file do not "
            "keep; PACKING_PADDING_FREE packs each micro-batch's pairs");
      }
      break;
    }
    default: {
      const TokenFiles& files = resolved.token_files();
      if (files.format() == TOKEN_FORMAT_UNSPECIFIED) {
        add("token_files.format",
            "is not set; set TOKEN_FORMAT_LLMC, TOKEN_FORMAT_UINT16 or TOKEN_FORMAT_UINT32");
      }
      check_files("token_files.", files.train_path(), files.eval_path(), "token file");
      if (files.has_document_start_token() &&
          (files.document_start_token() < 0 ||
           (vocab_size.has_value() && files.document_start_token() >= *vocab_size))) {
        add("token_files.document_start_token",
            absl::StrCat(
                files.document_start_token(), " is not a token id",
                vocab_size.has_value() ? absl::StrCat(" below vocab_size ", *vocab_size) : "",
                "; name the id that starts each document (the EOS tools/tokenize writes "
                "before each)"));
      }
    }
  }
  return problems;
}

std::vector<base::PlanFeature> FeaturesOf(const DataConfig& data, absl::string_view field_path) {
  std::vector<base::PlanFeature> features;
  for (const auto& [source, files] :
       {std::pair{"sft_files", data.has_sft_files() ? &data.sft_files() : nullptr},
        std::pair{"preference_files",
                  data.has_preference_files() ? &data.preference_files() : nullptr}}) {
    if (files == nullptr || files->packing() == PACKING_NONE) continue;
    const std::string field = absl::StrCat(field_path, ".", source, ".packing");
    const std::string packing = PackingStrategy_Name(files->packing());
    features.push_back({"packed_rows", field,
                        absl::StrCat(packing, " packs several sequences into a row"),
                        "use PACKING_NONE"});
    if (files->packing() == PACKING_PADDING_FREE) {
      features.push_back({"padding_free_rows", field,
                          absl::StrCat(packing, " pads each row by how a rank's examples pack"),
                          "use PACKING_BFD or PACKING_NONE"});
    }
  }
  if (data.has_token_files() && data.token_files().has_document_start_token()) {
    features.push_back({"document_masking",
                        absl::StrCat(field_path, ".token_files.document_start_token"),
                        "masks attention at each document's start within a row", "leave it unset"});
  }
  return features;
}

}  // namespace plait::data
