// Seeded mutations for the mutation tests of plait's file formats and configs, and the loop
// that runs them. Mutator damages a valid input the ways a disk, a network or a person do:
// byte edits (flip, insert, delete, truncate, duplicate a span), text edits (a number replaced
// by an extreme value or buried in deep nesting, a line deleted, duplicated or swapped) and
// JSON value edits; each returns what it did, so a failing case names itself and a fixed seed
// reproduces it. MutationCases runs each case under a watchdog (a case that hangs aborts the
// test, naming the case; so does a crash), fails the test on an escaping exception, and counts
// the cases accepted and rejected by mutation kind:
//
//   Mutator mutator(/*seed=*/1);
//   MutationCases cases(absl::Seconds(5));
//   for (int i = 0; i < 2000; ++i) {
//     std::string bytes = valid;
//     const std::string what = mutator.MutateBytes(bytes);
//     const absl::Status status = cases.Run("bytes", what, [&] { return Parse(bytes); });
//     if (!status.ok()) EXPECT_THAT(status.message(), HasSubstr("model.bin")) << what;
//   }
//   std::cout << cases.Summary("Parse");
#ifndef PLAIT_BASE_TESTING_MUTATIONS_H_
#define PLAIT_BASE_TESTING_MUTATIONS_H_

#include <signal.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace plait::base::testing {

// The numbers a mutation puts where a number was, as text: zero, -1, the edges of 32- and
// 64-bit integers (signed and unsigned) and one past them, huge, tiny and non-finite doubles.
const std::vector<std::string>& ExtremeNumberTexts();

// The integers among them that fit an int64_t.
const std::vector<int64_t>& ExtremeIntegers();

// The finite and non-finite doubles among them.
const std::vector<double>& ExtremeDoubles();

// A source of seeded mutations; the same seed gives the same sequence of mutations.
class Mutator {
 public:
  explicit Mutator(uint32_t seed) : random_(seed) {}

  // A uniform integer in [0, n); n > 0.
  size_t Below(size_t n);

  // A uniform element of `items`, which is not empty.
  template <typename T>
  const T& Pick(const std::vector<T>& items) {
    return items[Below(items.size())];
  }

  // Byte edits of `bytes`, each returning what it did ("flip byte 17: 0x7b -> 0x3b"). An edit
  // that needs a byte to work on inserts a run into empty input instead.
  std::string FlipByte(std::string& bytes);
  std::string InsertRun(std::string& bytes);  // 1 to 16 random or repeated bytes
  std::string DeleteRun(std::string& bytes);
  std::string Truncate(std::string& bytes);
  std::string DuplicateSpan(std::string& bytes);
  // One of the five, chosen at random.
  std::string MutateBytes(std::string& bytes);

  // Replaces one number of `text` (a run of digits, possibly signed, fractional or with an
  // exponent, not part of a name such as "F32") with one of ExtremeNumberTexts(). Without a
  // number in `text`, flips a byte.
  std::string ReplaceNumber(std::string& text);
  // Replaces one number of `text` with itself inside `depth` levels of `open` and `close`
  // ("[[[4]]]"): nesting far deeper than any real input, for parsers and for code that walks
  // the parsed tree recursively. Without a number in `text`, flips a byte.
  std::string NestNumber(std::string& text, int depth, absl::string_view open,
                         absl::string_view close);

  // Line edits of line-structured text (text protos, indented JSON).
  std::string DeleteLine(std::string& text);
  std::string DuplicateLine(std::string& text);
  std::string SwapLines(std::string& text);
  // One of the three, chosen at random.
  std::string MutateLines(std::string& text);

  // Changes one value of `json` (any node, at any depth): replaces it with an extreme number,
  // a string, null, a boolean, an empty or a nested container; deletes it from its parent;
  // duplicates it in its array; renames its key; or swaps it with a sibling (wraps it in an
  // array when it has none). The description
  // names the node by its JSON pointer ("/step: replaced by -1").
  std::string MutateJson(nlohmann::json& json);

 private:
  std::mt19937 random_;
};

// Writes `bytes` as the file `path`, a new file each time: rewriting one in place (truncating
// it) makes ext4 flush it on close, milliseconds per case where the rest takes microseconds.
void WriteCaseFile(const std::string& path, absl::string_view bytes);

// Runs mutation cases one at a time and counts their outcomes. While it lives, a case that
// runs longer than `per_case_limit` aborts the process after writing the case's description
// to stderr, and a fatal signal (a crash, an abort) writes it before the process dies, so a
// failure in thousands of generated cases names the one to reproduce. One at a time per
// process: it owns the process's handlers for SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT.
class MutationCases {
 public:
  explicit MutationCases(absl::Duration per_case_limit);
  ~MutationCases();
  MutationCases(const MutationCases&) = delete;
  MutationCases& operator=(const MutationCases&) = delete;

  // Runs `body` as the case `description` of mutation kind `kind` and returns its status,
  // counting it accepted (OK) or rejected. An exception escaping `body` fails the test,
  // naming the case, and is returned as an Internal error.
  absl::Status Run(absl::string_view kind, absl::string_view description,
                   const std::function<absl::Status()>& body);

  int64_t accepted() const;
  int64_t rejected() const;

  // One line for all cases under `title` and one per kind: "<kind>: N cases, A accepted,
  // R rejected".
  std::string Summary(absl::string_view title) const;

 private:
  struct Tally {
    int64_t accepted = 0;
    int64_t rejected = 0;
  };

  void Watch();

  const absl::Duration per_case_limit_;
  std::vector<char> signal_stack_;  // the calling thread's, for the signal handler
  stack_t previous_stack_ = {};
  std::map<std::string, Tally> tallies_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool in_case_ = false;
  bool stopping_ = false;
  absl::Time deadline_;
  std::thread watchdog_;
};

}  // namespace plait::base::testing

#endif  // PLAIT_BASE_TESTING_MUTATIONS_H_
