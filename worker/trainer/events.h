// ddp-trainer's event stream: one JSON object per line (design.md), written to the
// file descriptor named by DDP_EVENTS_FD, or to stdout. The worker agent parses these
// lines and relays them to the coordinator; users can also read them directly.
//
// Types (fields beyond design.md are documented in docs/trainer.md):
//   start       rank, world_size, backend, device, params, train/val samples, ...
//   buckets     the reducer's bucket layout
//   step        rank, epoch, step, global_step, loss, samples_per_s, step_ms, comm_ms, lr
//   trace       the reducer's timeline for one step (metrics.trace_buckets)
//   epoch       rank, epoch, train_loss, val_loss, val_accuracy, epoch_s
//   checkpoint  rank, path, epoch, step, global_step
//   done        rank, global_step, params_fingerprint, val_accuracy
//   error       rank, message, retryable
// Every event carries "type", "rank" and "time" (Unix seconds).
#ifndef DDP_WORKER_TRAINER_EVENTS_H_
#define DDP_WORKER_TRAINER_EVENTS_H_

#include <mutex>
#include <string>

#include "common/json_writer.h"

namespace ddp {

class EventSink {
 public:
  // `fd` < 0 means stdout. The sink does not own the descriptor.
  EventSink(int fd, int rank);

  // Starts an event of `type` with rank and time filled in.
  JsonObject Make(const char* type) const;
  // Writes one line; safe from any thread. A closed reader (EPIPE) turns the sink
  // off rather than killing the trainer.
  void Emit(const JsonObject& event);

 private:
  int fd_;
  int rank_;
  std::mutex mu_;
  bool broken_ = false;
};

}  // namespace ddp

#endif  // DDP_WORKER_TRAINER_EVENTS_H_
