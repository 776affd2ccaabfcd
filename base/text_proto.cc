#include "base/text_proto.h"

#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/descriptor.h"
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

absl::Status MergeFieldAssignment(absl::string_view assignment, absl::string_view source,
                                  absl::string_view root_name, google::protobuf::Message& message) {
  const size_t equals = assignment.find('=');
  if (equals == absl::string_view::npos || equals == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected path=value, e.g. training.steps=50"));
  }
  const std::vector<std::string> path = absl::StrSplit(assignment.substr(0, equals), '.');
  const std::string value(assignment.substr(equals + 1));

  // Walk the descriptors so errors name the component, and strings can be quoted here.
  const google::protobuf::Descriptor* descriptor = message.GetDescriptor();
  std::string walked(root_name);
  std::string prefix, suffix;
  for (size_t i = 0; i < path.size(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->FindFieldByName(path[i]);
    const std::string here = absl::StrCat(walked, ".", path[i]);
    if (field == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": ", walked, " has no field \"", path[i], "\""));
    }
    if (field->is_repeated()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": ", here, " is repeated; overrides set singular fields"));
    }
    const bool last = i + 1 == path.size();
    if (field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (last) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": ", here, " is a message; name one of its fields"));
      }
      absl::StrAppend(&prefix, path[i], " { ");
      suffix = absl::StrCat(" }", suffix);
      descriptor = field->message_type();
    } else {
      if (!last) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": ", here, " is not a message"));
      }
      const bool quote = field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_STRING;
      absl::StrAppend(&prefix, path[i], ": ",
                      quote ? absl::StrCat("\"", absl::CEscape(value), "\"") : value);
    }
    walked = here;
  }
  return MergeTextProto(absl::StrCat(prefix, suffix), source, message);
}

}  // namespace plait::base
