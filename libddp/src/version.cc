#include "ddp/version.h"

namespace ddp {

const char* version() { return DDP_VERSION_STRING; }

}  // namespace ddp
