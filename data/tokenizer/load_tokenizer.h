// Finds and loads the tokenizer a model was released with, from its Hugging Face folder (the
// one holding its config.json) or from one tokenizer file:
//   - tokenizer.json: byte-level BPE or BPE with byte fallback (bpe_tokenizer.h), with the
//     BOS / EOS tokens that the tokenizer_config.json beside it names;
//   - else tokenizer.model: SentencePiece (sentencepiece_tokenizer.h).
//
//   PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizer(hf_folder));
#ifndef PLAIT_DATA_TOKENIZER_LOAD_TOKENIZER_H_
#define PLAIT_DATA_TOKENIZER_LOAD_TOKENIZER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "data/tokenizer/tokenizer.h"

namespace plait::data::tokenizer {

// The tokenizer in folder `path`, or of the file `path` (a *.json is a tokenizer.json, any
// other file a SentencePiece model). NotFound, naming the folder and the files looked for,
// when it has none.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path);

}  // namespace plait::data::tokenizer

#endif  // PLAIT_DATA_TOKENIZER_LOAD_TOKENIZER_H_
