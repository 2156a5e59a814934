#include "libddp/engine/checkpoint.h"

#include <torch/serialize.h>

#include <cstdint>
#include <limits>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "libddp/engine/sampler.h"

namespace ddp {
namespace {

constexpr char kFormat1[] = "ddp.checkpoint/1";

using Dict = c10::impl::GenericDict;

// Reads typed values out of the checkpoint dict, naming the first key that is
// missing or of the wrong type.
class DictReader {
 public:
  DictReader(const Dict& d, const std::string& path) : d_(d), path_(path) {}

  c10::IValue Get(const char* key) const {
    auto it = d_.find(key);
    return it == d_.end() ? c10::IValue() : it->value();
  }
  absl::Status Int(const char* key, int64_t* out) const {
    c10::IValue v = Get(key);
    if (!v.isInt()) return Malformed(key);
    *out = v.toInt();
    return absl::OkStatus();
  }
  absl::Status Double(const char* key, double* out) const {
    c10::IValue v = Get(key);
    if (!v.isDouble()) return Malformed(key);
    *out = v.toDouble();
    return absl::OkStatus();
  }
  absl::Status Bool(const char* key, bool* out) const {
    c10::IValue v = Get(key);
    if (!v.isBool()) return Malformed(key);
    *out = v.toBool();
    return absl::OkStatus();
  }
  absl::Status String(const char* key, std::string* out) const {
    c10::IValue v = Get(key);
    if (!v.isString()) return Malformed(key);
    *out = v.toStringRef();
    return absl::OkStatus();
  }
  // Keys that format 1 files may lack: left as they are when absent.
  void OptionalInt(const char* key, int64_t* out) const {
    if (c10::IValue v = Get(key); v.isInt()) *out = v.toInt();
  }
  void OptionalString(const char* key, std::string* out) const {
    if (c10::IValue v = Get(key); v.isString()) *out = v.toStringRef();
  }
  absl::Status Malformed(const char* key) const {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", path_, ": '", key, "' is missing or of the wrong type: not a checkpoint "
        "ddp-trainer can resume (move it away or set checkpoint.resume: false)"));
  }

 private:
  const Dict& d_;
  const std::string& path_;
};

}  // namespace

bool SamePermutation(const SamplerState& saved, const SamplerState& now) {
  return saved.seed == now.seed && saved.shuffle == now.shuffle &&
         (saved.train_samples < 0 || saved.train_samples == now.train_samples) &&
         (saved.data_seed < 0 || saved.data_seed == now.data_seed);
}

bool SameDataOrder(const SamplerState& saved, const SamplerState& now) {
  return saved.world_size == now.world_size && saved.batch_size == now.batch_size &&
         saved.grad_accum_steps == now.grad_accum_steps && SamePermutation(saved, now);
}

int64_t SamplesDone(const TrainingState& s) {
  if (s.position.step == 0) return 0;
  const int64_t size = s.sampler.train_samples < 0 ? std::numeric_limits<int64_t>::max()
                                                   : s.sampler.train_samples;
  return EpochSamplesConsumed(size, s.order.offset, s.position.step - s.order.first_step,
                              s.sampler.grad_accum_steps, s.sampler.batch_size,
                              s.sampler.world_size);
}

std::vector<char> EncodeCheckpoint(const TrainingState& s) {
  Dict model(c10::StringType::get(), c10::TensorType::get());
  for (const auto& [name, t] : s.model) model.insert(name, t.detach().cpu());
  Dict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("format", std::string(kCheckpointFormat));
  d.insert("job", s.identity.job);
  d.insert("job_id", s.identity.job_id);
  d.insert("attempt", s.identity.attempt);
  d.insert("node", s.identity.node);
  d.insert("model", model);
  d.insert("optimizer", s.optimizer);
  d.insert("epoch", s.position.epoch);
  d.insert("step", s.position.step);
  d.insert("global_step", s.position.global_step);
  d.insert("world_size", s.sampler.world_size);
  d.insert("batch_size", s.sampler.batch_size);
  d.insert("grad_accum_steps", s.sampler.grad_accum_steps);
  d.insert("seed", s.sampler.seed);
  d.insert("shuffle", s.sampler.shuffle);
  d.insert("train_samples", s.sampler.train_samples);
  d.insert("data_seed", s.sampler.data_seed);
  d.insert("epoch_loss_sum", s.epoch_loss_sum);
  d.insert("epoch_steps", s.epoch_steps);
  d.insert("epoch_samples_done", SamplesDone(s));
  d.insert("epoch_order_offset", s.order.offset);
  d.insert("epoch_order_step", s.order.first_step);
  if (s.rng_state.defined()) d.insert("rng_state", s.rng_state);
  if (!s.lr_scheduler.isNone()) d.insert("lr_scheduler", s.lr_scheduler);
  return torch::pickle_save(d);
}

absl::StatusOr<TrainingState> DecodeCheckpoint(const std::vector<char>& bytes,
                                               const std::string& path) {
  c10::IValue v;
  try {
    v = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    std::string what = e.what();
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", path, " is unreadable (", what.substr(0, what.find('\n')),
        "): delete it or set checkpoint.resume: false"));
  }
  if (!v.isGenericDict()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", path, " is not a ddp checkpoint"));
  }
  const Dict d = v.toGenericDict();
  const DictReader r(d, path);
  std::string format;
  if (!r.String("format", &format).ok() || (format != kCheckpointFormat && format != kFormat1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", path, " is not in format ", kCheckpointFormat));
  }
  TrainingState s;
  r.OptionalString("job", &s.identity.job);
  r.OptionalString("job_id", &s.identity.job_id);
  r.OptionalInt("attempt", &s.identity.attempt);
  r.OptionalString("node", &s.identity.node);
  if (format == kCheckpointFormat) {
    DDP_RETURN_IF_ERROR(r.String("job_id", &s.identity.job_id));
    DDP_RETURN_IF_ERROR(r.Int("attempt", &s.identity.attempt));
  }
  c10::IValue model = r.Get("model");
  if (!model.isGenericDict()) return r.Malformed("model");
  for (const auto& entry : model.toGenericDict()) {
    if (!entry.key().isString() || !entry.value().isTensor()) return r.Malformed("model");
    s.model.emplace_back(entry.key().toStringRef(), entry.value().toTensor());
  }
  s.optimizer = r.Get("optimizer");
  DDP_RETURN_IF_ERROR(r.Int("epoch", &s.position.epoch));
  DDP_RETURN_IF_ERROR(r.Int("step", &s.position.step));
  DDP_RETURN_IF_ERROR(r.Int("global_step", &s.position.global_step));
  DDP_RETURN_IF_ERROR(r.Int("world_size", &s.sampler.world_size));
  DDP_RETURN_IF_ERROR(r.Int("batch_size", &s.sampler.batch_size));
  DDP_RETURN_IF_ERROR(r.Int("grad_accum_steps", &s.sampler.grad_accum_steps));
  DDP_RETURN_IF_ERROR(r.Int("seed", &s.sampler.seed));
  DDP_RETURN_IF_ERROR(r.Bool("shuffle", &s.sampler.shuffle));
  r.OptionalInt("train_samples", &s.sampler.train_samples);
  r.OptionalInt("data_seed", &s.sampler.data_seed);
  // The loss totals matter only mid-epoch; files that lack them restart the sums.
  if (!r.Double("epoch_loss_sum", &s.epoch_loss_sum).ok() ||
      !r.Int("epoch_steps", &s.epoch_steps).ok()) {
    s.epoch_loss_sum = 0;
    s.epoch_steps = 0;
  }
  // Files before decision 191 lack them: their epochs were sharded whole.
  r.OptionalInt("epoch_order_offset", &s.order.offset);
  r.OptionalInt("epoch_order_step", &s.order.first_step);
  if (s.order.offset < 0 || s.order.first_step < 0 || s.order.first_step > s.position.step) {
    return r.Malformed("epoch_order_offset");
  }
  s.epoch_samples_done = SamplesDone(s);
  if (c10::IValue rng = r.Get("rng_state"); rng.isTensor()) s.rng_state = rng.toTensor();
  return s;
}

absl::Status RestoreModel(const TrainingState& state, const std::vector<NamedTensor>& named,
                          const std::string& path) {
  if (state.model.size() != named.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", path, " holds ", state.model.size(), " tensors but the model has ",
        named.size(), ": it belongs to another model (move it away or set "
                      "checkpoint.resume: false)"));
  }
  std::map<std::string, const at::Tensor*> saved;
  for (const auto& [name, t] : state.model) saved[name] = &t;
  at::NoGradGuard no_grad;
  for (const auto& [name, t] : named) {
    auto it = saved.find(name);
    if (it == saved.end() || it->second->sizes() != t.sizes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint ", path, ": tensor '", name,
                       "' is missing or has another shape: it belongs to another model"));
    }
    at::Tensor dst = t;
    dst.copy_(*it->second);
  }
  return absl::OkStatus();
}

}  // namespace ddp
