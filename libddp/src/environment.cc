#include "ddp/environment.h"

#include "libddp/src/internal.h"
#include "worker/trainer/torchrun_env.h"

namespace ddp {

Environment read_environment() { return ValueOrThrow(ReadTorchrunEnv()); }

}  // namespace ddp
