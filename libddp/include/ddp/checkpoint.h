// ddp::Checkpointer: checkpoints of a data-parallel run, written atomically by each
// node's local rank 0 and loaded on every rank.
//
//   ddp::Checkpointer ckpt(group, {"/data/ckpt/{job_id}"});    // collective
//   ddp::Position pos = ckpt.load(*model.module(), opt).value_or(ddp::Position{});
//   for (epoch = pos.epoch; ...) { ...; ckpt.save(*model.module(), opt, {epoch + 1, 0, step}); }
//
// The file is torch.save-compatible (a pickled dict, ddp-trainer's format): "model"
// holds the module's parameters and buffers without any prefix and "optimizer" the
// torch.optim state_dict layout, so Python reads it with torch.load(path). A save
// writes to a temporary file, fsyncs and renames it (a kill never leaves a torn
// checkpoint), then keeps the newest `keep`. A load picks the newest checkpoint any
// rank holds and sends it to every rank over the process group, so nodes need no
// shared filesystem. {job_id} and {node} in `dir` are replaced from the environment.
#ifndef DDP_CHECKPOINT_H_
#define DDP_CHECKPOINT_H_

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <optional>
#include <string>

#include "ddp/position.h"
#include "ddp/process_group.h"

namespace ddp {


struct CheckpointOptions {
  std::string dir;        // Required. {job_id} and {node} are replaced.
  int64_t keep = 2;       // Checkpoints each writer keeps, newest first.
  bool resume = true;     // false: load() finds nothing.
  // Resume a checkpoint written by another job id (DDP_JOB_ID) too; refused otherwise.
  bool force = false;
  // save() returns once the state is copied into host memory; a background thread
  // writes it (decision 192), one save at a time: the next save(), wait(), load() or
  // the destructor waits for the one in flight, and save() or wait() throws the error
  // of one that failed.
  bool async = false;
};

class Checkpointer {
 public:
  // Collective: decides which ranks write and cleans what killed saves left.
  // Throws kInvalidArgument for an empty dir, kUnavailable when it cannot be created.
  Checkpointer(std::shared_ptr<ProcessGroup> group, CheckpointOptions options);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Collective: every rank calls it at the same position. Saves the module's state,
  // the optimizer's (SGD, Adam or AdamW, one param group) and rank 0's CPU generator.
  // Returns the path written on this rank ("" where this rank does not write); with
  // `async`, the path being written.
  std::string save(const torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                   const Position& position);
  // With `async`: waits until the save in flight is on disk; throws its error (kUnavailable
  // and the like, as save() would have). Without: returns at once.
  void wait();
  // Collective: loads the newest checkpoint into `module` and `optimizer` (and the CPU
  // generator) and returns its position; nullopt when there is none. Throws
  // kInvalidArgument when it belongs to another model or job.
  std::optional<Position> load(torch::nn::Module& module, torch::optim::Optimizer& optimizer);
  // The directory, placeholders replaced.
  const std::string& dir() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp

#endif  // DDP_CHECKPOINT_H_
