// Sequence packing: how variable-length sequences share rows of seq_len tokens instead of
// each padding a row of its own. BestFitDecreasing groups SFT examples into rows (data.proto's
// PACKING_BFD); DocumentPositions tells the documents of token-file rows apart
// (TokenFiles.document_start_token). Either way a row's sequences are told apart by their
// positions (data/batch.h), which restart at 0 with each sequence.
//
//   std::vector<std::vector<int64_t>> rows = BestFitDecreasing({5, 3, 2, 4}, 7);
//   // {{0, 2}, {3, 1}}: lengths 5 and 4 open a row each; 3 fills the row with 3 left,
//   // 2 the row with 2 left.
#ifndef PLAIT_DATA_PACKING_H_
#define PLAIT_DATA_PACKING_H_

#include <cstdint>
#include <vector>

#include "ATen/core/Tensor.h"

namespace plait::data {

// The indices of `lengths` (each in [1, capacity]) grouped into rows of at most `capacity`
// tokens by best-fit decreasing, exactly as TRL 1.16's `_pack_bfd` groups them: the lengths
// in decreasing order (equal lengths in index order), each placed into the row whose free
// space is the smallest that fits it (of rows with equal space, the one that came to have it
// first), or a new row when none fits. Rows in the order they were opened, each row's
// indices in the order they were placed.
std::vector<std::vector<int64_t>> BestFitDecreasing(const std::vector<int64_t>& lengths,
                                                    int64_t capacity);

// The positions (data::Batch::positions) of token rows `inputs` (int64 [rows, T]) whose
// documents each start with the token `document_start`: 0 at that token and at each row's
// first token, counting up to the next. The same device as `inputs`.
at::Tensor DocumentPositions(const at::Tensor& inputs, int64_t document_start);

}  // namespace plait::data

#endif  // PLAIT_DATA_PACKING_H_
