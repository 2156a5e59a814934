// ddp::Position: where training stands, as checkpoints record it and resume from it.
// No LibTorch here: ddp-trainer's engine and the public Checkpointer share it.
#ifndef DDP_POSITION_H_
#define DDP_POSITION_H_

#include <cstdint>

namespace ddp {

// `step` optimizer steps of `epoch` are done (`global_step` over all epochs).
struct Position {
  int64_t epoch = 0;
  int64_t step = 0;
  int64_t global_step = 0;
};

}  // namespace ddp

#endif  // DDP_POSITION_H_
