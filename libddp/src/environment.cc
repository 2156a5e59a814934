#include "ddp/environment.h"

#include "libddp/engine/environment.h"
#include "libddp/src/api_bridge.h"

namespace ddp {

Environment read_environment() { return ValueOrThrow(ReadEnvironment()); }

}  // namespace ddp
