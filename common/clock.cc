#include "common/clock.h"

namespace ddp {
namespace {

class WallClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

}  // namespace

Clock* RealClock() {
  static Clock* clock = new WallClock();
  return clock;
}

}  // namespace ddp
