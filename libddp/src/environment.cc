#include "ddp/environment.h"

#include "libddp/engine/api_bridge.h"
#include "libddp/engine/environment.h"

namespace ddp {

Environment read_environment() { return ValueOrThrow(ReadEnvironment()); }

}  // namespace ddp
