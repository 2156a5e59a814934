// ddp::Position: where training stands, as checkpoints record it and resume from it.
// Torch-free; the struct is <ddp/contract/position.h>.
#ifndef DDP_POSITION_H_
#define DDP_POSITION_H_

#include "ddp/contract/position.h"

#endif  // DDP_POSITION_H_
