// CPU time and resident memory of a process, from /proc (utime + stime, VmRSS):
// what the load generator reports for the coordinator, and for itself.
#ifndef DDP_BENCH_LOADGEN_PROC_STATS_H_
#define DDP_BENCH_LOADGEN_PROC_STATS_H_

#include <sys/types.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ddp::loadgen {

struct ProcSample {
  absl::Time at;
  double cpu_s = 0;    // utime + stime, in seconds.
  int64_t rss_kb = 0;  // VmRSS.
};

// NOT_FOUND if the process is gone; INTERNAL if /proc is not as expected.
absl::StatusOr<ProcSample> SampleProcess(pid_t pid);

// CPU cores used between two samples: CPU seconds over wall seconds.
double CoresBetween(const ProcSample& from, const ProcSample& to);

}  // namespace ddp::loadgen

#endif  // DDP_BENCH_LOADGEN_PROC_STATS_H_
