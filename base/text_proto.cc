#include "base/text_proto.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace plait::base {
namespace {

// Collects the parser's messages, warnings included, as "source:line:col: message".
class ErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  explicit ErrorCollector(absl::string_view source) : source_(source) {}

  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    errors_.push_back(absl::StrCat(source_, ":", line + 1, ":", column + 1, ": ", message));
  }
  void AddWarning(int line, google::protobuf::io::ColumnNumber column,
                  const std::string& message) override {
    AddError(line, column, message);
  }

  std::string Joined() const { return absl::StrJoin(errors_, "\n"); }

 private:
  std::string source_;
  std::vector<std::string> errors_;
};

}  // namespace

absl::Status MergeTextProto(absl::string_view text, absl::string_view source,
                            google::protobuf::Message& message) {
  ErrorCollector errors(source);
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  // Unknown fields are errors (the parser's default); this keeps it explicit.
  parser.AllowUnknownField(false);
  parser.AllowUnknownExtension(false);
  if (parser.MergeFromString(std::string(text), &message)) return absl::OkStatus();
  std::string joined = errors.Joined();
  if (joined.empty()) {
    joined = absl::StrCat(source, ": not a valid ", message.GetDescriptor()->full_name());
  }
  return absl::InvalidArgumentError(joined);
}

}  // namespace plait::base
