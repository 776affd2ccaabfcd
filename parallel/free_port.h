// A TCP port on 127.0.0.1 that is free when picked (the kernel's choice for port 0), for a
// rendezvous store on one machine. It is not reserved: another process may take it before
// it is bound again (torchrun's --master_port=0 has the same window).
#ifndef PLAIT_PARALLEL_FREE_PORT_H_
#define PLAIT_PARALLEL_FREE_PORT_H_

#include "absl/status/statusor.h"

namespace plait::parallel {

absl::StatusOr<int> PickFreeLoopbackPort();

}  // namespace plait::parallel

#endif  // PLAIT_PARALLEL_FREE_PORT_H_
