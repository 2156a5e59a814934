// The launch environment of one rank: torchrun's variables and ddp's, read and checked.
//
// ddp-worker sets them for every rank it starts (command jobs and ddp-trainer alike),
// and so does `torchrun --no-python`, so a program built on libddp runs under both.
// No LibTorch here; the struct is <ddp/contract/environment.h>.
#ifndef DDP_ENVIRONMENT_H_
#define DDP_ENVIRONMENT_H_

#include "ddp/contract/environment.h"

namespace ddp {

// Reads the process environment. RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are
// required; LOCAL_* and GROUP_RANK default to one node. Throws ddp::Error
// (kInvalidArgument) naming the variable: "WORLD_SIZE: expected an integer >= 1, got 'x'".
Environment read_environment();

}  // namespace ddp

#endif  // DDP_ENVIRONMENT_H_
