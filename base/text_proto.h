// Strict text-proto parsing for configs: unknown fields, a field given twice, two members of
// one oneof, enum values the enum does not declare and malformed text are InvalidArgument
// errors that give `source:line:col` (1-based, as editors count), every problem on its own
// line. A command-line override sets exactly one field of a parsed config, its value parsed
// as that field's type:
//
//   Plan plan;
//   PLAIT_RETURN_IF_ERROR(ParseTextProto(text, "plans/llama_fsdp.textproto", plan));
//   // "plans/llama_fsdp.textproto:3:5: Message type "plait.trainer.Plan" has no field ..."
//   PLAIT_RETURN_IF_ERROR(MergeFieldAssignment("training.steps=50", "--set", "plan", plan));
#ifndef PLAIT_BASE_TEXT_PROTO_H_
#define PLAIT_BASE_TEXT_PROTO_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace plait::base {

// Parses `text` into `message` (cleared first); `source` (a file name) starts every error
// line.
absl::Status ParseTextProto(absl::string_view text, absl::string_view source,
                            google::protobuf::Message& message);

// Sets one singular scalar field of `message` from "a.b.c=value": the value is the field's
// whole value, read by the text format's parser as the same text in a file is (an integer in
// range, octal "010" and hexadecimal "0x10" included; a number; true or false; an enum
// value's name or declared number), except a string, taken as it is, without quotes.
// InvalidArgument starting with `source` (e.g. "--set=a.b=1") and naming, from `root_name`,
// the path component that does not exist, is repeated or is a message, a message member of a
// oneof whose other member `message` sets (an override never replaces the file's choice with
// part of another; a scalar member, a whole value, does replace it), or the
// value that is not of the field's type ("plan.training has no field \"stepz\"",
// "plan.training.steps: \"5 x\" is not an integer"); a bad value leaves the field as it was.
absl::Status MergeFieldAssignment(absl::string_view assignment, absl::string_view source,
                                  absl::string_view root_name, google::protobuf::Message& message);

}  // namespace plait::base

#endif  // PLAIT_BASE_TEXT_PROTO_H_
