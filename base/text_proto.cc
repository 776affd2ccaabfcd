#include "base/text_proto.h"

#include <memory>
#include <string>
#include <vector>

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

// "source: path: problem" for enum fields of `message` (and the messages in it) that hold a
// number the enum does not declare, which proto3's parser lets through as a number.
void FindUndeclaredEnumValues(const google::protobuf::Message& message, const std::string& path,
                              absl::string_view source, std::vector<std::string>& errors) {
  const google::protobuf::Reflection* reflection = message.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const google::protobuf::FieldDescriptor* field : fields) {
    const std::string field_path = absl::StrCat(path, path.empty() ? "" : ".", field->name());
    const int count = field->is_repeated() ? reflection->FieldSize(message, field) : 1;
    for (int i = 0; i < count; ++i) {
      const std::string here =
          field->is_repeated() ? absl::StrCat(field_path, "[", i, "]") : field_path;
      if (field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
        FindUndeclaredEnumValues(field->is_repeated()
                                     ? reflection->GetRepeatedMessage(message, field, i)
                                     : reflection->GetMessage(message, field),
                                 here, source, errors);
      } else if (field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_ENUM) {
        const int number = field->is_repeated()
                               ? reflection->GetRepeatedEnumValue(message, field, i)
                               : reflection->GetEnumValue(message, field);
        if (field->enum_type()->FindValueByNumber(number) == nullptr) {
          errors.push_back(absl::StrCat(source, ": ", here, ": ", number, " is not a value of ",
                                        field->enum_type()->name()));
        }
      }
    }
  }
}

// What a value of the scalar, non-string `field` is, for errors: "an integer", "a number", ...
std::string ValueKind(const google::protobuf::FieldDescriptor& field) {
  using google::protobuf::FieldDescriptor;
  switch (field.cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return "a 32-bit integer";
    case FieldDescriptor::CPPTYPE_INT64:
      return "an integer";
    case FieldDescriptor::CPPTYPE_UINT32:
      return "a 32-bit unsigned integer";
    case FieldDescriptor::CPPTYPE_UINT64:
      return "an unsigned integer";
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT:
      return "a number";
    case FieldDescriptor::CPPTYPE_BOOL:
      return "true or false";
    case FieldDescriptor::CPPTYPE_ENUM:
      return absl::StrCat("a value of ", field.enum_type()->name());
    case FieldDescriptor::CPPTYPE_STRING:
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
  return "a scalar";
}

}  // namespace

absl::Status ParseTextProto(absl::string_view text, absl::string_view source,
                            google::protobuf::Message& message) {
  ErrorCollector errors(source);
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  // Unknown fields are errors (the parser's default); this keeps it explicit. Parsing (not
  // merging) makes a singular field given twice, and two members of one oneof, errors too.
  parser.AllowUnknownField(false);
  parser.AllowUnknownExtension(false);
  if (!parser.ParseFromString(std::string(text), &message)) {
    std::string joined = errors.Joined();
    if (joined.empty()) {
      joined = absl::StrCat(source, ": not a valid ", message.GetDescriptor()->full_name());
    }
    return absl::InvalidArgumentError(joined);
  }
  std::vector<std::string> undeclared;
  FindUndeclaredEnumValues(message, "", source, undeclared);
  if (!undeclared.empty()) return absl::InvalidArgumentError(absl::StrJoin(undeclared, "\n"));
  return absl::OkStatus();
}

absl::Status MergeFieldAssignment(absl::string_view assignment, absl::string_view source,
                                  absl::string_view root_name, google::protobuf::Message& message) {
  using google::protobuf::FieldDescriptor;
  const size_t equals = assignment.find('=');
  if (equals == absl::string_view::npos || equals == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected path=value, e.g. training.steps=50"));
  }
  const std::vector<std::string> path = absl::StrSplit(assignment.substr(0, equals), '.');
  const std::string value(assignment.substr(equals + 1));

  // Walk down to the field, naming the component that is wrong.
  google::protobuf::Message* target = &message;
  const FieldDescriptor* field = nullptr;
  std::string walked(root_name);
  for (size_t i = 0; i < path.size(); ++i) {
    field = target->GetDescriptor()->FindFieldByName(path[i]);
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
    // Setting a field inside a message member of a oneof whose other member the file chose
    // would drop the file's choice and its fields for a member given in part (an sgd field
    // over the file's adamw): refused, as the file's parser refuses two members. A scalar
    // member is a whole value and replaces the choice (model.hf_config_path over a preset).
    if (const google::protobuf::OneofDescriptor* oneof = field->real_containing_oneof();
        oneof != nullptr && !last) {
      const FieldDescriptor* chosen =
          target->GetReflection()->GetOneofFieldDescriptor(*target, oneof);
      if (chosen != nullptr && chosen != field) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": ", here, ": ", walked, ".", chosen->name(),
                         " is set, and both are members of the oneof ", walked, ".", oneof->name(),
                         "; an override cannot replace one with part of the other: change it in "
                         "the file"));
      }
    }
    const bool is_message = field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
    if (last && is_message) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": ", here, " is a message; name one of its fields"));
    }
    if (!last && !is_message) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": ", here, " is not a message"));
    }
    if (!last) target = target->GetReflection()->MutableMessage(target, field);
    walked = here;
  }

  const google::protobuf::Reflection* reflection = target->GetReflection();
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
    reflection->SetString(target, field, value);  // as it is, without the file's quotes
    return absl::OkStatus();
  }
  // Any other value is read by the text format's own parser, as the same text in the file
  // would be (010 is octal 8 there, 0x10 is 16, t is true), and must be the whole value. It is
  // parsed into a message of its own and moved over once it is known good: a bad value
  // leaves the field as it was.
  const auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", walked, ": \"", value, "\" is not ", ValueKind(*field)));
  };
  const std::unique_ptr<google::protobuf::Message> parsed(target->New());
  ErrorCollector errors(source);  // unread: `bad` says what was expected; keeps the log quiet
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFieldValueFromString(value, field, parsed.get())) return bad();
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_ENUM &&
      field->enum_type()->FindValueByNumber(reflection->GetEnumValue(*parsed, field)) == nullptr) {
    return bad();
  }
  reflection->SwapFields(parsed.get(), target, {field});
  return absl::OkStatus();
}

}  // namespace plait::base
