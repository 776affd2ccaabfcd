// A TCP port on 127.0.0.1 that is free when picked, for a rendezvous store on one machine.
// It is not reserved: another process may take it before it is bound again (torchrun's
// --master_port=0 has the same window). So it is drawn below the kernel's ephemeral range,
// where the local ports of outgoing connections (every TCP ring's) never land: only another
// listener can take it there. Where 64 draws find none free, the kernel's choice for port 0.
#ifndef PLAIT_PARALLEL_FREE_PORT_H_
#define PLAIT_PARALLEL_FREE_PORT_H_

#include "absl/status/statusor.h"

namespace plait::parallel {

absl::StatusOr<int> PickFreeLoopbackPort();

}  // namespace plait::parallel

#endif  // PLAIT_PARALLEL_FREE_PORT_H_
