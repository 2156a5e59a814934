// ddp::Position: where training stands, as checkpoints record it and resume from it.
//
// A contract type: torch-free, defined here once. The engine's checkpoints (libddp/engine)
// and the built-in trainer use it from here; libddp publishes this same file as
// <ddp/contract/position.h>, which <ddp/position.h> includes.
#ifndef DDP_CONTRACT_POSITION_H_
#define DDP_CONTRACT_POSITION_H_

#include <cstdint>

namespace ddp {

// `step` optimizer steps of `epoch` are done (`global_step` over all epochs).
struct Position {
  int64_t epoch = 0;
  int64_t step = 0;
  int64_t global_step = 0;
};

}  // namespace ddp

#endif  // DDP_CONTRACT_POSITION_H_
