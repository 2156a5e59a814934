#include "ddp/recovery.h"

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <chrono>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "ddp/report.h"
#include "libddp/engine/checkpoint_keeper.h"
#include "libddp/engine/recovery.h"
#include "libddp/src/api_bridge.h"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

double MillisSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

}  // namespace

struct LiveRecovery::Impl {
  std::shared_ptr<ProcessGroup> group;
  DataParallel* ddp = nullptr;
  LiveRecoveryOptions options;
  NamedTensors tensors;
  std::vector<torch::optim::Optimizer*> optimizers;
  std::vector<std::pair<std::string, int64_t*>> counters;
  int64_t steps = 0;  // Steps completed by this state (carried to replacements).
  int recoveries = 0;
  Reporter reporter;

  Comm& comm() { return *group->impl().comm; }
  const Environment& env() { return group->impl().env; }

  std::vector<char> Encode() {
    torch::serialize::OutputArchive archive;
    for (size_t i = 0; i < tensors.size(); ++i) {
      archive.write(absl::StrCat("t", i), tensors[i].second.detach().cpu());
    }
    for (size_t i = 0; i < optimizers.size(); ++i) {
      torch::serialize::OutputArchive sub;
      optimizers[i]->save(sub);
      archive.write(absl::StrCat("optimizer", i), sub);
    }
    std::vector<int64_t> values = {steps};
    for (auto& [name, c] : counters) values.push_back(*c);
    archive.write("counters", at::tensor(values, at::kLong));
    archive.write("rng", CpuRngState());
    std::ostringstream out;
    archive.save_to(out);
    const std::string bytes = out.str();
    return std::vector<char>(bytes.begin(), bytes.end());
  }

  void Decode(const std::vector<char>& bytes) {
    torch::serialize::InputArchive archive;
    archive.load_from(bytes.data(), bytes.size());
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < tensors.size(); ++i) {
      at::Tensor t;
      archive.read(absl::StrCat("t", i), t);
      tensors[i].second.copy_(t);
    }
    for (size_t i = 0; i < optimizers.size(); ++i) {
      torch::serialize::InputArchive sub;
      archive.read(absl::StrCat("optimizer", i), sub);
      optimizers[i]->load(sub);
    }
    at::Tensor values;
    archive.read("counters", values);
    const int64_t* v = values.data_ptr<int64_t>();
    steps = v[0];
    for (size_t i = 0; i < counters.size(); ++i) *counters[i].second = v[i + 1];
    at::Tensor rng;
    archive.read("rng", rng);
    RestoreRngState(rng);
  }

  // Collective in a new generation: every rank takes the state of the rank with the
  // most completed steps (`have_state`: false for a replacement).
  absl::StatusOr<StateSource> Sync(bool have_state) {
    DDP_ASSIGN_OR_RETURN(const StateSource source, ChooseSource(comm(), have_state ? steps : -1));
    std::vector<char> bytes;
    if (comm().rank() == source.rank) bytes = Encode();
    DDP_ASSIGN_OR_RETURN(bytes, comm().BroadcastBytesFrom(source.rank, bytes,
                                                          "live recovery: sending the state"));
    if (comm().rank() != source.rank) {
      try {
        Decode(bytes);
      } catch (const std::exception& e) {
        return absl::InvalidArgumentError(absl::StrCat(
            "live recovery: rank ", source.rank, "'s state does not fit this rank's tracked "
            "state (every rank must track the same tensors, optimizers and counters): ",
            e.what()));
      }
    }
    return source;
  }

  // After `cause` broke a step: the next generation, formed and synced.
  absl::Status Recover(const absl::Status& cause) {
    const auto t0 = Clock::now();
    const Environment& env0 = env();
    DDP_LOG(WARNING) << "rank " << env0.rank << ": " << cause.message()
                     << "; keeping this rank's state and waiting for a replacement";
    ddp->impl().DropReducer();
    group->impl().comm.reset();  // Gone first: ranks still blocked on this one fail too.
    for (auto& [name, t] : tensors) {
      if (t.grad().defined()) t.mutable_grad().reset();
    }
    DDP_ASSIGN_OR_RETURN(const Environment next,
                         NextGeneration(env0, cause, absl::FromChrono(options.timeout)));
    const double wait_ms = MillisSince(t0);
    const auto t1 = Clock::now();
    DDP_RETURN_IF_ERROR(group->impl().Reconnect(next));
    // The order a replacement's program makes them in: the group, DDP's broadcast,
    // then start()'s transfer.
    DDP_RETURN_IF_ERROR(ddp->impl().Rebuild());
    DDP_ASSIGN_OR_RETURN(const StateSource source, Sync(/*have_state=*/true));
    ++recoveries;
    DDP_LOG(INFO) << "rank " << next.rank << ": generation " << next.generation
                  << " formed; took rank " << source.rank << "'s state after "
                  << source.global_step << " steps";
    if (next.rank == 0) {
      reporter.recovered(next.generation, source.rank, source.global_step, wait_ms,
                         MillisSince(t1));
    }
    return absl::OkStatus();
  }
};

LiveRecovery::LiveRecovery(std::shared_ptr<ProcessGroup> group, DataParallel& ddp,
                           LiveRecoveryOptions options)
    : impl_(std::make_unique<Impl>()) {
  if (group == nullptr) ThrowIfError(absl::InvalidArgumentError("LiveRecovery: no process group"));
  if (options.timeout.count() <= 0) {
    ThrowIfError(absl::InvalidArgumentError("LiveRecoveryOptions.timeout must be positive"));
  }
  impl_->group = std::move(group);
  impl_->ddp = &ddp;
  impl_->options = options;
}

LiveRecovery::~LiveRecovery() = default;

void LiveRecovery::track(const NamedTensors& tensors) {
  for (const auto& t : tensors) impl_->tensors.push_back(t);
}

void LiveRecovery::track(torch::optim::Optimizer& optimizer) {
  impl_->optimizers.push_back(&optimizer);
}

void LiveRecovery::track(const std::string& name, int64_t* counter) {
  if (counter == nullptr) {
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat("LiveRecovery::track: counter '", name,
                                                         "' is null")));
  }
  impl_->counters.emplace_back(name, counter);
}

void LiveRecovery::start() {
  if (impl_->env().generation == 0) return;
  const auto t0 = Clock::now();
  const StateSource source = ValueOrThrow(impl_->Sync(/*have_state=*/false));
  if (impl_->env().rank == 0) {
    impl_->reporter.recovered(impl_->env().generation, source.rank, source.global_step, 0,
                              MillisSince(t0));
  }
}

bool LiveRecovery::run(const std::function<void()>& step) {
  absl::Status cause;
  try {
    step();
    ++impl_->steps;
    return true;
  } catch (const Error& e) {
    cause = StatusFromError(e);
  } catch (const std::exception& e) {
    // A failed all-reduce inside backward: the reducer kept its status.
    std::optional<absl::Status> st = impl_->ddp->impl().TakeBackwardError();
    if (!st.has_value()) throw;
    cause = *st;
  }
  const Environment& env = impl_->env();
  if (!PeerFailure(cause) || env.generation_file.empty()) ThrowIfError(cause);
  ThrowIfError(impl_->Recover(cause));
  return false;
}

bool checkpoint_requested(ProcessGroup& group) {
  static int64_t handled = 0;  // The newest notice acted on, by this process.
  ProcessGroup::Impl& g = group.impl();
  if (g.env.notice_file.empty()) return false;
  const Notice seen = ReadNotice(g.env.notice_file);
  // Maxima over the ranks, so that every rank answers alike (a replacement has acted
  // on none).
  const std::vector<double> v = ValueOrThrow(
      g.comm->MaxOverRanks({static_cast<double>(seen.seq), static_cast<double>(handled)}));
  const auto newest = static_cast<int64_t>(v[0]);
  handled = static_cast<int64_t>(v[1]);
  if (newest <= handled) return false;
  handled = newest;
  return true;
}

int LiveRecovery::generation() const { return impl_->env().generation; }
int LiveRecovery::recoveries() const { return impl_->recoveries; }

}  // namespace ddp
