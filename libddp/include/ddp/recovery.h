// ddp::LiveRecovery: a libddp program survives the loss of a peer rank without a
// restart and without a checkpoint (docs/recovery.md; job.yaml max_recoveries).
//
// When a rank dies, the collective in flight fails on the others. With LiveRecovery
// they do not exit: each keeps its model, optimizer and counters, drops its process
// group, and waits for ddp-worker to announce the attempt's next generation (a new
// store; a replacement started for the dead rank). The ranks form the new group,
// every rank takes the state of the rank that has completed the most steps, and the
// interrupted step is done again. The loop stays short:
//
//   auto group = ddp::init_process_group();
//   ddp::DistributedDataParallel model(Net(), group);
//   torch::optim::SGD opt(model.module()->parameters(), 0.1);
//   int64_t step = 0;                                 // the position: a counter
//   ddp::LiveRecovery live(group, model.core());
//   live.track(ddp::detail::Named(model.module()->named_parameters()));
//   live.track(ddp::detail::Named(model.module()->named_buffers()));
//   live.track(opt);
//   live.track("step", &step);
//   live.start();      // a replacement takes the survivors' state here
//   while (step < total_steps) {
//     if (live.run([&] { train_one_step(step); })) ++step;
//   }
//
// The contract (what a program must not do): everything that must be the same on
// every rank after a recovery is tracked (parameters, buffers, optimizers, the
// counters the loop is written over: the loop reads its position from them at the
// top of each iteration, so a recovery that moves them on is followed); the step's
// data comes from that position (a sampler seeded by epoch); a step does nothing
// outside `run` that another rank must match (no collectives between steps) and keeps
// no state of its own outside what is tracked. A step that fails for any other reason
// than a lost peer throws as before. The CPU generator's state travels with the rest.
#ifndef DDP_RECOVERY_H_
#define DDP_RECOVERY_H_

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "ddp/distributed_data_parallel.h"
#include "ddp/process_group.h"

namespace ddp {

struct LiveRecoveryOptions {
  // How long a surviving rank waits for the next generation before it gives up and
  // throws the step's error (the job then restarts from its checkpoint). Keep it at
  // least job.yaml's recovery_timeout_s, after which the coordinator gives up itself.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

class LiveRecovery {
 public:
  // `group` and `ddp` (DistributedDataParallel::core()) must outlive this object; a
  // recovery reconnects them in place.
  LiveRecovery(std::shared_ptr<ProcessGroup> group, DataParallel& ddp,
               LiveRecoveryOptions options = {});
  ~LiveRecovery();
  LiveRecovery(const LiveRecovery&) = delete;
  LiveRecovery& operator=(const LiveRecovery&) = delete;

  // What a replacement receives, registered once before start(): tensors (copied in
  // place), optimizers (their state_dict), counters.
  void track(const NamedTensors& tensors);
  void track(torch::optim::Optimizer& optimizer);
  void track(const std::string& name, int64_t* counter);

  // Collective on a replacement's generation: takes the state of the rank with the
  // most completed steps. Returns at once on an attempt's first processes
  // (DDP_GENERATION 0 or unset). Throws ddp::Error when the transfer fails.
  void start();

  // Runs one step. True when it completed; false when a peer was lost during it and
  // this rank recovered: the tracked state is now every rank's (the counters may have
  // moved on by one step), and the loop carries on from it. Rethrows the step's
  // error when it is not a lost peer, or when no generation comes within the timeout.
  bool run(const std::function<void()>& step);

  // The attempt's generation this rank is in; live recoveries it took part in.
  int generation() const;
  int recoveries() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The checkpoint-now notice (docs/recovery.md): whether ddp asked this job to
// checkpoint now, because it is about to move (a drain, a higher-priority job, its
// worker stopping on SIGTERM). Collective: every rank calls it at the same step (every
// step, or every few), and all get the same answer, true once per notice. Checkpoint
// then, report it (Reporter::checkpoint) and ddp moves the job from that checkpoint;
// the ranks are stopped soon after (DDP_STOP_GRACE_S: SIGTERM to SIGKILL). Costs one
// small all-reduce; false at once, without one, outside ddp-worker.
bool checkpoint_requested(ProcessGroup& group);

}  // namespace ddp

#endif  // DDP_RECOVERY_H_
