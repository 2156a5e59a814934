#include "ddp/checkpoint.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "libddp/engine/background_saver.h"
#include "libddp/engine/checkpoint.h"
#include "libddp/engine/checkpoint_keeper.h"
#include "libddp/engine/optimizer.h"
#include "libddp/src/api_bridge.h"

namespace ddp {
namespace {

std::vector<NamedTensor> ModuleState(const torch::nn::Module& module) {
  std::vector<NamedTensor> out;
  for (const auto& p : module.named_parameters()) out.emplace_back(p.key(), p.value());
  for (const auto& b : module.named_buffers()) out.emplace_back(b.key(), b.value());
  return out;
}

}  // namespace

struct Checkpointer::Impl {
  std::shared_ptr<ProcessGroup> group;
  std::string dir;
  std::unique_ptr<CheckpointKeeper> keeper;
  std::unique_ptr<BackgroundSaver> saver;  // CheckpointOptions.async on a writer.

  // Waits for the save in flight (with `async`); its error, if it failed.
  absl::Status Finish() {
    if (!saver) return absl::OkStatus();
    saver->Wait();
    std::optional<BackgroundSaver::Finished> done = saver->TakeFinished();
    if (done.has_value() && !done->path.ok()) return done->path.status();
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Save(const torch::nn::Module& module,
                                   torch::optim::Optimizer& optimizer, const Position& position) {
    ProcessGroup::Impl& pg = group->impl();
    DDP_ASSIGN_OR_RETURN(OptimizerSpec spec, OptimizerSpecOf(optimizer));
    DDP_ASSIGN_OR_RETURN(at::Tensor rng, RankZeroRngState(*pg.comm, pg.device.device));
    if (!keeper->writer()) return std::string();
    TrainingState state;
    state.identity.job = pg.env.job_id;
    state.position = {position.epoch, position.step, position.global_step};
    state.sampler.world_size = pg.env.world_size;
    state.model = ModuleState(module);
    state.optimizer = OptimizerStateDict(spec, optimizer);
    state.rng_state = rng;
    if (saver) {
      DDP_RETURN_IF_ERROR(Finish());  // One copy in memory at a time.
      saver->Submit(Snapshot(state), /*copy=*/false);
      return keeper->PathFor(position.global_step);
    }
    return keeper->Save(std::move(state));
  }

  absl::StatusOr<std::optional<Position>> Load(torch::nn::Module& module,
                                               torch::optim::Optimizer& optimizer) {
    DDP_ASSIGN_OR_RETURN(OptimizerSpec spec, OptimizerSpecOf(optimizer));
    DDP_RETURN_IF_ERROR(Finish());
    DDP_ASSIGN_OR_RETURN(std::optional<CheckpointKeeper::Restored> restored, keeper->Restore());
    if (!restored.has_value()) return std::optional<Position>();
    const TrainingState& ckpt = restored->state;
    DDP_RETURN_IF_ERROR(RestoreModel(ckpt, ModuleState(module), restored->path));
    DDP_RETURN_IF_ERROR(LoadOptimizerStateDict(spec, optimizer, ckpt.optimizer));
    if (ckpt.rng_state.defined()) RestoreRngState(ckpt.rng_state);
    return Position{ckpt.position.epoch, ckpt.position.step, ckpt.position.global_step};
  }
};

Checkpointer::Checkpointer(std::shared_ptr<ProcessGroup> group, CheckpointOptions options)
    : impl_(std::make_unique<Impl>()) {
  if (group == nullptr) ThrowIfError(absl::InvalidArgumentError("Checkpointer: no process group"));
  if (options.dir.empty()) {
    ThrowIfError(absl::InvalidArgumentError("CheckpointOptions.dir: empty; say where to keep "
                                            "checkpoints (e.g. /data/ckpt/{job_id})"));
  }
  if (options.keep < 1) {
    ThrowIfError(absl::InvalidArgumentError(
        absl::StrCat("CheckpointOptions.keep: ", options.keep, " must be >= 1")));
  }
  ProcessGroup::Impl& pg = group->impl();
  CheckpointKeeper::Options keeper;
  keeper.dir_template = options.dir;
  keeper.dir = CheckpointDirFor(options.dir, pg.env);
  keeper.keep = options.keep;
  using Resume = CheckpointKeeper::Options::Resume;
  keeper.resume = !options.resume ? Resume::kNo : options.force ? Resume::kForce : Resume::kYes;
  impl_->dir = keeper.dir;
  impl_->keeper = std::make_unique<CheckpointKeeper>(std::move(keeper), pg.env, &*pg.comm,
                                                     pg.device.device);
  impl_->group = std::move(group);
  ThrowIfError(impl_->keeper->Setup());
  if (options.async && impl_->keeper->writer()) {
    impl_->saver = std::make_unique<BackgroundSaver>(impl_->keeper.get());
  }
}

Checkpointer::~Checkpointer() = default;

std::string Checkpointer::save(const torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                               const Position& position) {
  return ValueOrThrow(impl_->Save(module, optimizer, position));
}

void Checkpointer::wait() {
  ThrowIfError(impl_->Finish());
}

std::optional<Position> Checkpointer::load(torch::nn::Module& module,
                                           torch::optim::Optimizer& optimizer) {
  return ValueOrThrow(impl_->Load(module, optimizer));
}

const std::string& Checkpointer::dir() const { return impl_->dir; }

}  // namespace ddp
