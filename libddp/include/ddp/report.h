// ddp::Reporter: a program's progress for `ddpctl watch`, as ddp-trainer reports it.
//
// Under ddp-worker (a command job) every rank has DDP_EVENTS_FD, and each call writes
// one JSON line there; the worker relays it and `ddpctl watch` shows the rank's loss,
// throughput and epoch. Without DDP_EVENTS_FD calls do nothing (DDP_REPORT_STDOUT=1
// writes to stdout instead). A report never blocks training: a full pipe drops it.
// Fields left at their "unset" value (NaN, -1, empty) are not sent.
#ifndef DDP_REPORT_H_
#define DDP_REPORT_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>

namespace ddp {

inline constexpr double kUnset = std::numeric_limits<double>::quiet_NaN();

struct StepReport {
  double loss = kUnset;  // Required.
  int64_t epoch = -1;
  int64_t step = -1;     // 0-based in the epoch.
  int64_t steps = -1;    // Steps per epoch.
  int64_t global_step = -1;
  double samples_per_s = kUnset;
  double step_ms = kUnset;
  double comm_ms = kUnset;
  double lr = kUnset;
  // The rank's GPU memory: fill them from gpu_memory() (left unset on the CPU).
  double gpu_memory_allocated_mib = kUnset;
  double gpu_memory_reserved_mib = kUnset;
  double gpu_memory_peak_mib = kUnset;
  // Where step_ms went, as far as the program measures it (ddpctl watch, the straggler
  // note and ddp_rank_step_phase_seconds show it): waiting for its batches, forward and
  // backward less comm_ms, the optimizer.
  double data_ms = kUnset;
  double compute_ms = kUnset;
  double optimizer_ms = kUnset;
};

// GPU `device` of this process (-1: the current one) as its CUDA caching allocator
// sees it, in MiB: torch.cuda.memory_allocated, memory_reserved, max_memory_allocated.
// All unset (NaN) in a build without CUDA or before anything was put on the GPU.
struct GpuMemory {
  double allocated_mib = kUnset;
  double reserved_mib = kUnset;
  double peak_mib = kUnset;
};
GpuMemory gpu_memory(int device = -1);

struct EpochReport {
  int64_t epoch = -1;
  double train_loss = kUnset;
  double val_loss = kUnset;
  double val_accuracy = kUnset;  // A fraction, 0..1.
};

class Reporter {
 public:
  // From DDP_EVENTS_FD (or DDP_REPORT_STDOUT=1).
  Reporter();
  // To descriptor `fd` (-1: nowhere).
  explicit Reporter(int fd);
  bool enabled() const { return fd_ >= 0; }

  void step(const StepReport& report);
  void epoch(const EpochReport& report);
  void checkpoint(const std::string& path, int64_t epoch, int64_t step, int64_t global_step);
  // Why this rank is about to fail (shown by `ddpctl get` and `watch`); `retryable`
  // is shown with it.
  void error(const std::string& message, bool retryable = true);
  void done(int64_t epochs, int64_t global_step);
  // Rank 0, once a live recovery's new generation formed and the state moved (the
  // coordinator counts the recovery done); LiveRecovery calls it.
  void recovered(int64_t generation, int64_t source_rank, int64_t global_step, double wait_ms,
                 double sync_ms);

 private:
  void Write(const std::string& line);
  int fd_ = -1;
  std::mutex mu_;
};

}  // namespace ddp

#endif  // DDP_REPORT_H_
