// Where job.yaml meets libddp's engine: the one place that maps a JobSpec's fields onto
// the engine's own option types (libddp/engine/ knows nothing of job.yaml). Each
// function is the whole mapping of its type; a field the engine gains an option for is
// mapped here, and nowhere else. (train.optimizer needs no mapping: it is the contract
// type ddp::OptimizerSpec, common/contract/optimizer_spec.h, which the engine takes.)
#ifndef DDP_TRAINER_ENGINE_OPTIONS_H_
#define DDP_TRAINER_ENGINE_OPTIONS_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include "common/jobspec/job_spec.h"
#include "ddp/comm_hooks.h"
#include "ddp/distributed_data_parallel.h"
#include "libddp/engine/checkpoint_keeper.h"
#include "libddp/engine/comm.h"

namespace ddp {

// `backend` and `train.device`: what ChooseDevice picks from.
inline DeviceRequest DeviceRequestOf(const JobSpec& spec) {
  DeviceRequest r;
  switch (spec.backend) {
    case Backend::kAuto: r.backend = DeviceRequest::Backend::kAuto; break;
    case Backend::kGloo: r.backend = DeviceRequest::Backend::kGloo; break;
    case Backend::kNccl: r.backend = DeviceRequest::Backend::kNccl; break;
  }
  switch (spec.train.device) {
    case Device::kAuto: r.device = DeviceRequest::Device::kAuto; break;
    case Device::kCpu: r.device = DeviceRequest::Device::kCpu; break;
    case Device::kCuda: r.device = DeviceRequest::Device::kCuda; break;
  }
  return r;
}

// `rdzv.timeout_s`, `train.collective_timeout_s` and `train.intra_node_comm`.
inline CommOptions CommOptionsOf(const JobSpec& spec) {
  auto ms = [](double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); };
  CommOptions co;
  co.rdzv_timeout = ms(spec.rdzv.timeout_s);
  co.collective_timeout = ms(spec.train.collective_timeout_s);
  switch (spec.train.intra_node_comm) {
    case IntraNodeComm::kAuto: co.intra_node = CommOptions::IntraNode::kAuto; break;
    case IntraNodeComm::kShm: co.intra_node = CommOptions::IntraNode::kShm; break;
    case IntraNodeComm::kGloo: co.intra_node = CommOptions::IntraNode::kGloo; break;
  }
  return co;
}

// `train.bucket_cap_mb` and `train.first_bucket_cap_mb`: the reducer's buckets.
inline DdpOptions DdpOptionsOf(const JobSpec& spec) {
  DdpOptions o;
  o.bucket_cap_mb = spec.train.bucket_cap_mb;
  o.first_bucket_cap_mb = spec.train.first_bucket_cap_mb;
  return o;
}

// `train.powersgd`: PowerSGDState's arguments (comm_hook: powersgd).
inline hooks::PowerSGDOptions PowerSgdOptionsOf(const PowerSgdSpec& p) {
  hooks::PowerSGDOptions o;
  o.matrix_approximation_rank = p.rank;
  o.start_powerSGD_iter = p.start_iteration;
  o.min_compression_rate = p.min_compression_rate;
  o.use_error_feedback = p.error_feedback;
  o.warm_start = p.warm_start;
  o.orthogonalization_epsilon = p.orthogonalization_epsilon;
  o.random_seed = static_cast<uint32_t>(p.random_seed);
  o.batch_tensors_with_same_shape = p.batch_tensors_with_same_shape;
  return o;
}

// `checkpoint`: `checkpoint.dir` with its placeholders replaced (the trainer's spec), and
// as written (`dir_template`), `checkpoint.keep` and `checkpoint.resume`. The trainer
// keeps `every_epochs` and `every_steps` (when to save) to itself.
inline CheckpointKeeper::Options KeeperOptionsOf(const CheckpointSpec& checkpoint,
                                                 std::string dir_template) {
  CheckpointKeeper::Options o;
  o.dir_template = std::move(dir_template);
  o.dir = checkpoint.dir;
  o.keep = checkpoint.keep;
  switch (checkpoint.resume) {
    case ResumePolicy::kNo: o.resume = CheckpointKeeper::Options::Resume::kNo; break;
    case ResumePolicy::kYes: o.resume = CheckpointKeeper::Options::Resume::kYes; break;
    case ResumePolicy::kForce: o.resume = CheckpointKeeper::Options::Resume::kForce; break;
  }
  return o;
}

}  // namespace ddp

#endif  // DDP_TRAINER_ENGINE_OPTIONS_H_
