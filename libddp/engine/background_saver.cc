#include "libddp/engine/background_saver.h"

#include <chrono>
#include <utility>

#include "common/logging.h"

namespace ddp {
namespace {

at::Tensor HostCopy(const at::Tensor& t) {
  if (!t.defined()) return t;
  const at::Tensor d = t.detach();
  // to(kCPU) of a GPU tensor is a copy already; a CPU tensor must be cloned.
  return d.is_cpu() ? d.clone() : d.to(at::kCPU);
}

c10::IValue DeepHostCopy(const c10::IValue& v) {
  if (v.isTensor()) return HostCopy(v.toTensor());
  if (v.isGenericDict()) {
    const c10::impl::GenericDict in = v.toGenericDict();
    c10::impl::GenericDict out(in.keyType(), in.valueType());
    out.reserve(in.size());
    for (const auto& entry : in) out.insert(entry.key(), DeepHostCopy(entry.value()));
    return out;
  }
  if (v.isList()) {
    const c10::List<c10::IValue> in = v.toList();
    c10::impl::GenericList out(in.elementType());
    out.reserve(in.size());
    for (const c10::IValue& e : in) out.push_back(DeepHostCopy(e));
    return out;
  }
  if (v.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const c10::IValue& e : v.toTupleRef().elements()) elements.push_back(DeepHostCopy(e));
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  return v;  // Numbers, strings, None: values already.
}

}  // namespace

TrainingState Snapshot(const TrainingState& state) {
  TrainingState s;
  s.identity = state.identity;
  s.position = state.position;
  s.sampler = state.sampler;
  s.order = state.order;
  s.epoch_samples_done = state.epoch_samples_done;
  s.epoch_loss_sum = state.epoch_loss_sum;
  s.epoch_steps = state.epoch_steps;
  s.model.reserve(state.model.size());
  for (const auto& [name, t] : state.model) s.model.emplace_back(name, HostCopy(t));
  s.optimizer = DeepHostCopy(state.optimizer);
  s.lr_scheduler = DeepHostCopy(state.lr_scheduler);
  s.rng_state = HostCopy(state.rng_state);
  return s;
}

BackgroundSaver::BackgroundSaver(CheckpointKeeper* keeper)
    : keeper_(keeper), thread_([this] { Run(); }) {}

BackgroundSaver::~BackgroundSaver() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return Idle(); });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

namespace {
double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

double BackgroundSaver::Submit(TrainingState state, bool copy) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return Idle(); });
  const double waited = MsSince(t0);
  pending_ = std::move(state);
  copy_ = copy;
  copying_ = copy;
  lock.unlock();
  cv_.notify_all();
  return waited;
}

double BackgroundSaver::WaitForCopy() {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  if (!copying_) return 0;
  cv_.wait(lock, [this] { return !copying_; });
  return MsSince(t0);
}

void BackgroundSaver::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return Idle(); });
}

std::optional<BackgroundSaver::Finished> BackgroundSaver::TakeFinished() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(finished_, std::nullopt);
}

void BackgroundSaver::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || pending_.has_value(); });
    if (!pending_.has_value()) return;  // stop_, nothing left.
    TrainingState state = std::move(*pending_);
    pending_.reset();
    const bool copy = copy_;
    writing_ = true;
    lock.unlock();
    Finished f;
    f.global_step = state.position.global_step;
    if (copy) {
      const auto c0 = std::chrono::steady_clock::now();
      state = Snapshot(state);  // The loop's tensors are read, not changed, meanwhile.
      f.copy_ms = MsSince(c0);
      lock.lock();
      copying_ = false;
      lock.unlock();
      cv_.notify_all();
    }
    const auto t0 = std::chrono::steady_clock::now();
    f.path = keeper_->Save(std::move(state));
    f.write_ms = MsSince(t0);
    if (!f.path.ok()) DDP_LOG(WARNING) << "background checkpoint save failed: " << f.path.status();
    lock.lock();
    finished_ = std::move(f);
    writing_ = false;
    cv_.notify_all();
  }
}

}  // namespace ddp
