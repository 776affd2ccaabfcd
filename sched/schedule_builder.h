// Builds a Schedule (schedule.h) from its configuration (schedule.proto), after checking
// every field. An invalid config is an InvalidArgument error naming the field, under
// `field_path`, and its value:
//
//   absl::StatusOr<Schedule> schedule = BuildSchedule(plan.schedule(), "plan.schedule");
//   // error: "plan.schedule.warmup.steps: 2000 is longer than the run
//   //         (plan.schedule.total_steps = 1000)"
#ifndef PLAIT_SCHED_SCHEDULE_BUILDER_H_
#define PLAIT_SCHED_SCHEDULE_BUILDER_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sched/schedule.h"
#include "sched/schedule.pb.h"

namespace plait::sched {

absl::StatusOr<Schedule> BuildSchedule(const ScheduleConfig& config,
                                       absl::string_view field_path = "schedule");

}  // namespace plait::sched

#endif  // PLAIT_SCHED_SCHEDULE_BUILDER_H_
