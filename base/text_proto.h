// Strict text-proto parsing for configs: unknown fields, bad enum values and malformed text
// are InvalidArgument errors that give `source:line:col` (1-based, as editors count), every
// problem the parser found on its own line. Merging parses into a message that already holds
// values, which is how command-line overrides go through the same checks as the file:
//
//   Plan plan;
//   PLAIT_RETURN_IF_ERROR(MergeTextProto(text, "plans/llama_fsdp.textproto", plan));
//   // "plans/llama_fsdp.textproto:3:5: Message type "plait.trainer.Plan" has no field ..."
//   PLAIT_RETURN_IF_ERROR(MergeFieldAssignment("training.steps=50", "--set", "plan", plan));
#ifndef PLAIT_BASE_TEXT_PROTO_H_
#define PLAIT_BASE_TEXT_PROTO_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace plait::base {

// Parses `text` into `message`, keeping the fields it already has unless `text` sets them.
// `source` (a file name, or "--set=...") starts every error line.
absl::Status MergeTextProto(absl::string_view text, absl::string_view source,
                            google::protobuf::Message& message);

// Sets one singular scalar field of `message` from "a.b.c=value" (value as in a text proto;
// strings need no quotes), through MergeTextProto: a command-line override checked like the
// file it overrides. InvalidArgument starting with `source` (e.g. "--set=a.b=1") and naming
// the path component that does not exist, is repeated, or is a message, from `root_name`
// ("plan.training has no field \"stepz\"").
absl::Status MergeFieldAssignment(absl::string_view assignment, absl::string_view source,
                                  absl::string_view root_name, google::protobuf::Message& message);

}  // namespace plait::base

#endif  // PLAIT_BASE_TEXT_PROTO_H_
