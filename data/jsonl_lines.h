// The lines of a JSONL file, read with their length bounded: a line longer than the bound is
// an error naming the file, the line and the bound as soon as the bound is passed, before the
// line is held whole, parsed or tokenized. Every JSONL reader of plait (SFT and DPO examples,
// text to tokenize) reads through it:
//
//   PLAIT_RETURN_IF_ERROR(ForEachJsonlLine(path, [&](std::string& line, int64_t number) {
//     return AddExample(line, absl::StrCat(path, ":", number));
//   }));
//   // "train.jsonl:7: longer than 64.0 MiB, the most a JSONL line may hold; ..."
#ifndef PLAIT_DATA_JSONL_LINES_H_
#define PLAIT_DATA_JSONL_LINES_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace plait::data {

// The longest JSONL line plait reads, 64 MiB. A line is one document or one example; the
// longest context trained today, 10^6 tokens, is about 4 MB as text and 8 MB as token ids
// written in JSON (an id and its separator take up to 8 characters), so 64 MiB leaves 8 times
// that. A longer line is a file that is not one example a line (a JSON array on one line, a
// dump without newlines), and reading it whole would hold it, and the parsed JSON tree at
// several times its size, in memory before anything could be said about it.
inline constexpr int64_t kMaxJsonlLineBytes = int64_t{64} << 20;

// Called with each line of a file, its '\n' removed (the callee may move from it), and its
// number, from 1.
using JsonlLineFunction = std::function<absl::Status(std::string& line, int64_t number)>;

// Calls `on_line` for each line of the file `path` in order (blank lines too; a final line
// without '\n' as well), returning the first error it returns. InvalidArgument
// "<path>:<number>: longer than ..." for a line of more than `max_line_bytes` bytes, as soon
// as that many are read; base::OpenForReading's errors for a path that is no readable regular
// file; DataLoss when reading fails.
absl::Status ForEachJsonlLine(const std::string& path, const JsonlLineFunction& on_line,
                              int64_t max_line_bytes = kMaxJsonlLineBytes);

// OK when a line of `bytes` bytes, line `number` of `path`, is within `max_line_bytes`; else
// ForEachJsonlLine's error: for a reader that holds the file's text already.
absl::Status CheckJsonlLineLength(absl::string_view path, int64_t number, size_t bytes,
                                  int64_t max_line_bytes = kMaxJsonlLineBytes);

}  // namespace plait::data

#endif  // PLAIT_DATA_JSONL_LINES_H_
