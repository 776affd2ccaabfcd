#include "base/testing_mutations.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace plait::base::testing {
namespace {

using Json = nlohmann::json;

// The case MutationCases is running, for the watchdog and the signal handler, which may
// only read plain memory: its description, truncated, NUL-terminated.
std::array<char, 1024> current_case = {};
constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
struct sigaction previous_actions[std::size(kFatalSignals)];
// The handler's own stack, so that it runs after a stack overflow too.
constexpr size_t kSignalStackBytes = 1 << 16;

void WriteToStderr(const char* text) {
  for (size_t left = std::strlen(text); left > 0;) {
    const ssize_t written = write(STDERR_FILENO, text, left);
    if (written <= 0) return;
    text += written;
    left -= static_cast<size_t>(written);
  }
}

void SetCurrentCase(absl::string_view description) {
  const size_t size = std::min(description.size(), current_case.size() - 1);
  std::memcpy(current_case.data(), description.data(), size);
  current_case[size] = '\0';
}

// Names the case, puts back the handler that was there before and raises the signal again
// for it (a fault raised again on return from here: the default action, or a sanitizer's
// report).
void OnFatalSignal(int signal) {
  WriteToStderr("\n*** fatal signal ");
  WriteToStderr(strsignal(signal));
  WriteToStderr(" in mutation case: ");
  WriteToStderr(current_case.data());
  WriteToStderr("\n");
  for (size_t i = 0; i < std::size(kFatalSignals); ++i) {
    if (kFatalSignals[i] == signal) sigaction(signal, &previous_actions[i], nullptr);
  }
  raise(signal);
}

// The positions and lengths of the numbers in `text` (see Mutator::ReplaceNumber).
std::vector<std::pair<size_t, size_t>> FindNumbers(const std::string& text) {
  std::vector<std::pair<size_t, size_t>> numbers;
  auto is_name = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t i = 0; i < text.size();) {
    const bool sign = (text[i] == '-' || text[i] == '+') && i + 1 < text.size() &&
                      std::isdigit(static_cast<unsigned char>(text[i + 1]));
    const bool digit = std::isdigit(static_cast<unsigned char>(text[i]));
    if ((!sign && !digit) || (i > 0 && (is_name(text[i - 1]) || text[i - 1] == '.'))) {
      ++i;
      continue;
    }
    size_t end = i + 1;
    while (end < text.size() && (std::isdigit(static_cast<unsigned char>(text[end])) ||
                                 text[end] == '.' || text[end] == 'e' || text[end] == 'E' ||
                                 ((text[end] == '-' || text[end] == '+') &&
                                  (text[end - 1] == 'e' || text[end - 1] == 'E')))) {
      ++end;
    }
    if (end == text.size() || !is_name(text[end])) numbers.emplace_back(i, end - i);
    i = end;
  }
  return numbers;
}

// The pointer ("/a/0/b") of every node of `json`, the root ("") first; iterative, so that a
// deeply nested input cannot overflow the stack here.
std::vector<Json::json_pointer> AllPointers(const Json& json) {
  std::vector<Json::json_pointer> pointers;
  std::vector<std::pair<const Json*, Json::json_pointer>> pending = {{&json, Json::json_pointer()}};
  while (!pending.empty()) {
    auto [node, pointer] = pending.back();
    pending.pop_back();
    pointers.push_back(pointer);
    if (node->is_object()) {
      for (auto it = node->begin(); it != node->end(); ++it) {
        pending.emplace_back(&*it, pointer / it.key());
      }
    } else if (node->is_array()) {
      for (size_t i = 0; i < node->size(); ++i) pending.emplace_back(&(*node)[i], pointer / i);
    }
  }
  return pointers;
}

}  // namespace

const std::vector<std::string>& ExtremeNumberTexts() {
  static const auto* const texts = new std::vector<std::string>{
      "0",
      "-1",
      "1",
      "-2147483648",
      "2147483647",
      "2147483648",
      "4294967296",
      "4611686018427387904",  // 2^62
      "-9223372036854775808",
      "9223372036854775807",
      "9223372036854775808",
      "18446744073709551615",
      "18446744073709551616",
      "1e308",
      "-1e308",
      "1e309",
      "4.9e-324",
      "0.5",
      "-0",
      "nan",
      "inf",
      "-inf",
  };
  return *texts;
}

const std::vector<int64_t>& ExtremeIntegers() {
  static const auto* const integers = [] {
    auto* result = new std::vector<int64_t>;
    for (const std::string& text : ExtremeNumberTexts()) {
      int64_t value = 0;
      if (absl::SimpleAtoi(text, &value)) result->push_back(value);
    }
    return result;
  }();
  return *integers;
}

const std::vector<double>& ExtremeDoubles() {
  static const auto* const doubles = [] {
    auto* result = new std::vector<double>;
    for (const std::string& text : ExtremeNumberTexts()) {
      double value = 0;
      if (absl::SimpleAtod(text, &value)) result->push_back(value);
    }
    return result;
  }();
  return *doubles;
}

size_t Mutator::Below(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(random_); }

std::string Mutator::FlipByte(std::string& bytes) {
  if (bytes.empty()) return InsertRun(bytes);
  const size_t at = Below(bytes.size());
  const unsigned char before = static_cast<unsigned char>(bytes[at]);
  const unsigned char after = before ^ static_cast<unsigned char>(1 + Below(255));
  bytes[at] = static_cast<char>(after);
  return absl::StrFormat("flip byte %d: 0x%02x -> 0x%02x", at, before, after);
}

std::string Mutator::InsertRun(std::string& bytes) {
  const size_t at = Below(bytes.size() + 1);
  const size_t length = 1 + Below(16);
  std::string run;
  // Half the runs repeat one byte, a structural character often: "{{{{", "\0\0\0".
  static constexpr char kRepeated[] = {'\0', '\xff', '{', '[', '"', ',', ':', '\n', '0', '9'};
  if (Below(2) == 0) {
    run.assign(length, kRepeated[Below(sizeof(kRepeated))]);
  } else {
    for (size_t i = 0; i < length; ++i) run.push_back(static_cast<char>(Below(256)));
  }
  bytes.insert(at, run);
  return absl::StrFormat("insert %d bytes at %d: %s", length, at, absl::CHexEscape(run));
}

std::string Mutator::DeleteRun(std::string& bytes) {
  if (bytes.empty()) return InsertRun(bytes);
  const size_t at = Below(bytes.size());
  const size_t length = 1 + Below(std::min<size_t>(16, bytes.size() - at));
  bytes.erase(at, length);
  return absl::StrFormat("delete %d bytes at %d", length, at);
}

std::string Mutator::Truncate(std::string& bytes) {
  if (bytes.empty()) return InsertRun(bytes);
  const size_t size = Below(bytes.size());
  bytes.resize(size);
  return absl::StrFormat("truncate to %d bytes", size);
}

std::string Mutator::DuplicateSpan(std::string& bytes) {
  if (bytes.empty()) return InsertRun(bytes);
  const size_t begin = Below(bytes.size());
  const size_t length = 1 + Below(std::min<size_t>(64, bytes.size() - begin));
  const size_t at = Below(bytes.size() + 1);
  bytes.insert(at, bytes.substr(begin, length));
  return absl::StrFormat("copy bytes [%d, %d) to %d", begin, begin + length, at);
}

std::string Mutator::MutateBytes(std::string& bytes) {
  switch (Below(5)) {
    case 0:
      return FlipByte(bytes);
    case 1:
      return InsertRun(bytes);
    case 2:
      return DeleteRun(bytes);
    case 3:
      return Truncate(bytes);
    default:
      return DuplicateSpan(bytes);
  }
}

std::string Mutator::ReplaceNumber(std::string& text) {
  const std::vector<std::pair<size_t, size_t>> numbers = FindNumbers(text);
  if (numbers.empty()) return FlipByte(text);
  const auto [at, length] = Pick(numbers);
  const std::string& extreme = Pick(ExtremeNumberTexts());
  const std::string before = text.substr(at, length);
  text.replace(at, length, extreme);
  return absl::StrFormat("number at %d: %s -> %s", at, before, extreme);
}

std::string Mutator::NestNumber(std::string& text, int depth, absl::string_view open,
                                absl::string_view close) {
  const std::vector<std::pair<size_t, size_t>> numbers = FindNumbers(text);
  if (numbers.empty()) return FlipByte(text);
  const auto [at, length] = Pick(numbers);
  std::string nested;
  nested.reserve(depth * (open.size() + close.size()) + length);
  for (int i = 0; i < depth; ++i) absl::StrAppend(&nested, open);
  nested += text.substr(at, length);
  for (int i = 0; i < depth; ++i) absl::StrAppend(&nested, close);
  text.replace(at, length, nested);
  return absl::StrFormat("number at %d nested %d deep in %s%s", at, depth, open, close);
}

std::string Mutator::DeleteLine(std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  const size_t line = Below(lines.size());
  const std::string gone = lines[line];
  lines.erase(lines.begin() + static_cast<ptrdiff_t>(line));
  text = absl::StrJoin(lines, "\n");
  return absl::StrCat("delete line ", line + 1, ": ", gone);
}

std::string Mutator::DuplicateLine(std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  const size_t line = Below(lines.size());
  lines.insert(lines.begin() + static_cast<ptrdiff_t>(line), lines[line]);
  text = absl::StrJoin(lines, "\n");
  return absl::StrCat("duplicate line ", line + 1, ": ", lines[line]);
}

std::string Mutator::SwapLines(std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  const size_t a = Below(lines.size());
  // Another line than `a` where there is one.
  const size_t b = lines.size() < 2 ? a : (a + 1 + Below(lines.size() - 1)) % lines.size();
  std::swap(lines[a], lines[b]);
  text = absl::StrJoin(lines, "\n");
  return absl::StrCat("swap lines ", a + 1, " and ", b + 1);
}

std::string Mutator::MutateLines(std::string& text) {
  switch (Below(3)) {
    case 0:
      return DeleteLine(text);
    case 1:
      return DuplicateLine(text);
    default:
      return SwapLines(text);
  }
}

std::string Mutator::MutateJson(Json& json) {
  const std::vector<Json::json_pointer> pointers = AllPointers(json);
  const Json::json_pointer& pointer = Pick(pointers);
  const std::string where = pointer.to_string();
  Json& node = json[pointer];
  const bool has_parent = !pointer.empty();
  switch (Below(has_parent ? 4 : 1)) {
    case 0: {  // replace
      Json value;
      switch (Below(6)) {
        case 0:
          value = Pick(ExtremeIntegers());
          break;
        case 1:
          value = std::numeric_limits<uint64_t>::max();
          break;
        case 2: {
          const double number = Pick(ExtremeDoubles());
          // JSON has no NaN or infinity (they would be written as null).
          value = std::isfinite(number) ? number : 1e308;
          break;
        }
        case 3:
          value = Pick(std::vector<Json>{"", "x", std::string(4096, 'a'), std::string("\0", 1),
                                         "F32", "I64"});
          break;
        case 4:
          value = Pick(std::vector<Json>{nullptr, true, false, Json::array(), Json::object()});
          break;
        default:
          value = Json::array({Pick(ExtremeIntegers()), Pick(ExtremeIntegers())});
          break;
      }
      std::string what = value.dump();
      if (what.size() > 40) what = absl::StrCat(what.substr(0, 40), "...");
      node = std::move(value);
      return absl::StrCat(where, ": replaced by ", what);
    }
    case 1: {  // delete
      Json& parent = json[pointer.parent_pointer()];
      if (parent.is_object()) {
        parent.erase(pointer.back());
      } else {
        parent.erase(static_cast<size_t>(std::stoul(pointer.back())));
      }
      return absl::StrCat(where, ": deleted");
    }
    case 2: {  // duplicate, or rename the key
      Json& parent = json[pointer.parent_pointer()];
      if (parent.is_array()) {
        const size_t at = static_cast<size_t>(std::stoul(pointer.back()));
        parent.insert(parent.begin() + static_cast<ptrdiff_t>(at), Json(node));
        return absl::StrCat(where, ": duplicated");
      }
      const std::string& key = pointer.back();
      const std::string renamed = Pick(std::vector<std::string>{
          "", absl::StrCat(key, "_"), key.empty() ? "x" : key.substr(1), "__metadata__"});
      Json value = std::move(node);
      parent.erase(key);
      parent[renamed] = std::move(value);
      return absl::StrCat(where, ": key renamed to \"", renamed, "\"");
    }
    default: {  // swap with a sibling
      Json& parent = json[pointer.parent_pointer()];
      std::vector<Json*> siblings;
      for (Json& sibling : parent) {
        if (&sibling != &node) siblings.push_back(&sibling);
      }
      if (siblings.empty()) {
        node = Json::array({node});
        return absl::StrCat(where, ": wrapped in an array");
      }
      std::swap(node, *Pick(siblings));
      return absl::StrCat(where, ": swapped with a sibling");
    }
  }
}

void WriteCaseFile(const std::string& path, absl::string_view bytes) {
  std::remove(path.c_str());
  std::ofstream file(path, std::ios::binary);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  file.close();
  ASSERT_TRUE(file) << path << ": cannot write";
}

MutationCases::MutationCases(absl::Duration per_case_limit) : per_case_limit_(per_case_limit) {
  signal_stack_.resize(kSignalStackBytes);
  stack_t stack = {};
  stack.ss_sp = signal_stack_.data();
  stack.ss_size = signal_stack_.size();
  sigaltstack(&stack, &previous_stack_);
  struct sigaction action = {};
  action.sa_handler = OnFatalSignal;
  action.sa_flags = SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  for (size_t i = 0; i < std::size(kFatalSignals); ++i) {
    sigaction(kFatalSignals[i], &action, &previous_actions[i]);
  }
  watchdog_ = std::thread([this] { Watch(); });
}

MutationCases::~MutationCases() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  watchdog_.join();
  for (size_t i = 0; i < std::size(kFatalSignals); ++i) {
    sigaction(kFatalSignals[i], &previous_actions[i], nullptr);
  }
  sigaltstack(&previous_stack_, nullptr);
}

void MutationCases::Watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    if (in_case_ && absl::Now() >= deadline_) {
      WriteToStderr(absl::StrCat("\n*** mutation case ran past ",
                                 absl::FormatDuration(per_case_limit_), ": ", current_case.data(),
                                 "\n")
                        .c_str());
      std::abort();
    }
    wake_.wait_for(lock, std::chrono::milliseconds(50));
  }
}

absl::Status MutationCases::Run(absl::string_view kind, absl::string_view description,
                                const std::function<absl::Status()>& body) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    SetCurrentCase(description);
    deadline_ = absl::Now() + per_case_limit_;
    in_case_ = true;
  }
  absl::Status status;
  try {
    status = body();
  } catch (const std::exception& exception) {
    ADD_FAILURE() << "an exception escaped (" << exception.what() << ") in case: " << description;
    status = absl::InternalError(exception.what());
  } catch (...) {
    ADD_FAILURE() << "an exception escaped in case: " << description;
    status = absl::InternalError("an exception that is not a std::exception");
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    in_case_ = false;
  }
  Tally& tally = tallies_[std::string(kind)];
  ++(status.ok() ? tally.accepted : tally.rejected);
  return status;
}

int64_t MutationCases::accepted() const {
  int64_t total = 0;
  for (const auto& [kind, tally] : tallies_) total += tally.accepted;
  return total;
}

int64_t MutationCases::rejected() const {
  int64_t total = 0;
  for (const auto& [kind, tally] : tallies_) total += tally.rejected;
  return total;
}

std::string MutationCases::Summary(absl::string_view title) const {
  auto line = [](int64_t accepted, int64_t rejected) {
    return absl::StrCat(accepted + rejected, " cases, ", accepted, " accepted, ", rejected,
                        " rejected");
  };
  std::string summary = absl::StrCat(title, ": ", line(accepted(), rejected()), "\n");
  for (const auto& [kind, tally] : tallies_) {
    absl::StrAppend(&summary, "  ", kind, ": ", line(tally.accepted, tally.rejected), "\n");
  }
  return summary;
}

}  // namespace plait::base::testing
