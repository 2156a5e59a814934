// The built-in communication hooks, line for line after PyTorch 2.x's
// torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py and powerSGD_hook.py.
#include "ddp/comm_hooks.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "libddp/src/api_bridge.h"

namespace ddp {
namespace hooks {
namespace {

// default_hooks._compress_hook.
at::Tensor CompressHook(at::ScalarType dtype, ProcessGroup& group, GradBucket& bucket) {
  const at::Tensor& buffer = bucket.buffer();
  at::Tensor compressed = buffer.to(dtype).div_(group.world_size());
  group.all_reduce_sum(compressed);
  // Decompressed in place, as PyTorch does.
  buffer.copy_(compressed);
  return buffer;
}

// The sum of an empty tensor is itself: skipped (every rank skips it alike).
void AllReduce(ProcessGroup& group, at::Tensor& t) {
  if (t.numel() > 0) group.all_reduce_sum(t);
}

// powerSGD_hook._orthogonalize_gram_schmidt.
void OrthogonalizeGramSchmidt(const at::Tensor& matrices, double epsilon) {
  const int64_t cols = matrices.size(2);
  for (int64_t i = 0; i < cols; ++i) {
    at::Tensor col = matrices.narrow(2, i, 1);
    at::Tensor norm = at::linalg_vector_norm(col, 2, at::IntArrayRef{1}, /*keepdim=*/true);
    if (epsilon == 0) {
      col.div_(norm);
    } else {
      col.div_(norm + epsilon);
    }
    if (i + 1 < cols) {
      at::Tensor rest = matrices.narrow(2, i + 1, cols - i - 1);
      rest.sub_(at::sum(col * rest, at::IntArrayRef{1}, /*keepdim=*/true) * col);
    }
  }
}

// powerSGD_hook._orthogonalize.
void Orthogonalize(const at::Tensor& matrices, double epsilon) {
  const int64_t rank = matrices.size(2);
  const at::ScalarType dtype = matrices.scalar_type();
  if (rank <= 2 || dtype == at::kHalf || dtype == at::kBFloat16) {
    OrthogonalizeGramSchmidt(matrices, epsilon);
  } else {
    matrices.copy_(std::get<0>(at::linalg_qr(matrices)));
  }
}

}  // namespace

at::Tensor allreduce_hook(ProcessGroup& group, GradBucket& bucket) {
  at::Tensor tensor = bucket.buffer();
  // Divided first, as default_hooks._allreduce_fut does (against overflow).
  tensor.div_(group.world_size());
  group.all_reduce_sum(tensor);
  return tensor;
}

at::Tensor fp16_compress_hook(ProcessGroup& group, GradBucket& bucket) {
  return CompressHook(at::kHalf, group, bucket);
}

at::Tensor bf16_compress_hook(ProcessGroup& group, GradBucket& bucket) {
  return CompressHook(at::kBFloat16, group, bucket);
}

PowerSGDState::PowerSGDState(std::shared_ptr<ProcessGroup> process_group,
                             PowerSGDOptions options)
    : process_group_(std::move(process_group)), options_(options), rng_(options.random_seed) {
  if (process_group_ == nullptr) {
    ThrowIfError(absl::InvalidArgumentError(
        "PowerSGDState: no process group: pass the one DistributedDataParallel uses"));
  }
  if (options_.matrix_approximation_rank < 1) {
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
        "PowerSGDState: matrix_approximation_rank is ", options_.matrix_approximation_rank,
        ": it must be at least 1")));
  }
  if ((options_.use_error_feedback || options_.warm_start) && options_.start_powerSGD_iter <= 1) {
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
        "PowerSGDState: start_powerSGD_iter is ", options_.start_powerSGD_iter,
        ": it must be > 1 when use_error_feedback or warm_start is on, because PowerSGD can "
        "only be applied after the first two iterations in DDP (set start_powerSGD_iter to 2 "
        "or more, or turn both off)")));
  }
}

std::tuple<double, int64_t, int64_t> PowerSGDState::compression_stats() const {
  const double rate = total_numel_after_compression_ > 0
                          ? static_cast<double>(total_numel_before_compression_) /
                                static_cast<double>(total_numel_after_compression_)
                          : 0.0;
  return {rate, total_numel_before_compression_, total_numel_after_compression_};
}

namespace {

// The options a saved state must have been made with, by name.
std::vector<std::pair<std::string, at::Tensor>> OptionTensors(const PowerSGDOptions& o) {
  auto i64 = [](int64_t v) { return at::scalar_tensor(v, at::kLong); };
  auto f64 = [](double v) { return at::scalar_tensor(v, at::kDouble); };
  return {{"option.matrix_approximation_rank", i64(o.matrix_approximation_rank)},
          {"option.start_powerSGD_iter", i64(o.start_powerSGD_iter)},
          {"option.min_compression_rate", f64(o.min_compression_rate)},
          {"option.use_error_feedback", i64(o.use_error_feedback)},
          {"option.warm_start", i64(o.warm_start)},
          {"option.orthogonalization_epsilon", f64(o.orthogonalization_epsilon)},
          {"option.random_seed", i64(o.random_seed)},
          {"option.batch_tensors_with_same_shape", i64(o.batch_tensors_with_same_shape)}};
}

at::Tensor TextTensor(const std::string& text) {
  return at::tensor(std::vector<uint8_t>(text.begin(), text.end()), at::kByte);
}

std::string TensorText(const at::Tensor& t) {
  const at::Tensor bytes = t.to(at::kCPU, at::kByte).contiguous();
  const auto* data = bytes.data_ptr<uint8_t>();
  return std::string(data, data + bytes.numel());
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> PowerSGDState::state_dict() const {
  std::vector<std::pair<std::string, at::Tensor>> out = OptionTensors(options_);
  out.emplace_back("iter", at::scalar_tensor(iter_, at::kLong));
  out.emplace_back("total_numel_before_compression",
                   at::scalar_tensor(total_numel_before_compression_, at::kLong));
  out.emplace_back("total_numel_after_compression",
                   at::scalar_tensor(total_numel_after_compression_, at::kLong));
  std::ostringstream rng;
  rng << rng_;  // The Mersenne Twister's 624 words and position, as text.
  out.emplace_back("rng", TextTensor(rng.str()));
  for (const auto& [prefix, dict] : {std::pair{"error.", &error_dict_},
                                     std::pair{"p_memory.", &p_memory_dict_},
                                     std::pair{"q_memory.", &q_memory_dict_}}) {
    for (const auto& [bucket, t] : *dict) {
      out.emplace_back(absl::StrCat(prefix, bucket), t.detach().clone());
    }
  }
  return out;
}

void PowerSGDState::load_state_dict(const std::vector<std::pair<std::string, at::Tensor>>& state) {
  auto fail = [](const std::string& why) {
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat("PowerSGDState::load_state_dict: ", why)));
  };
  std::map<std::string, at::Tensor> given;
  for (const auto& [name, t] : state) {
    if (!t.defined()) fail(absl::StrCat("entry '", name, "' holds no tensor"));
    given[name] = t;
  }
  for (const auto& [name, want] : OptionTensors(options_)) {
    auto it = given.find(name);
    if (it == given.end()) fail(absl::StrCat("no '", name, "': not a PowerSGDState's state_dict()"));
    if (it->second.numel() != 1 || it->second.item<double>() != want.item<double>()) {
      fail(absl::StrCat("the state was saved with ", name.substr(7), " = ",
                        it->second.numel() == 1 ? absl::StrCat(it->second.item<double>()) : "?",
                        ", this PowerSGDState has ", want.item<double>(),
                        ": make it with the options the saved run used"));
    }
    given.erase(it);
  }
  auto scalar = [&](const std::string& name) -> int64_t {
    auto it = given.find(name);
    if (it == given.end()) fail(absl::StrCat("no '", name, "' entry"));
    if (it->second.numel() != 1) fail(absl::StrCat("'", name, "' is not one number"));
    const int64_t v = it->second.item<int64_t>();
    given.erase(it);
    return v;
  };
  const int64_t iter = scalar("iter");
  const int64_t before = scalar("total_numel_before_compression");
  const int64_t after = scalar("total_numel_after_compression");
  auto rng_it = given.find("rng");
  if (rng_it == given.end()) fail("no 'rng' entry");
  std::mt19937 rng;
  std::istringstream rng_text(TensorText(rng_it->second));
  rng_text >> rng;
  if (rng_text.fail()) fail("'rng' is not a Mersenne Twister's state");
  given.erase(rng_it);
  std::map<int64_t, at::Tensor> dicts[3];
  const char* prefixes[3] = {"error.", "p_memory.", "q_memory."};
  for (const auto& [name, t] : given) {
    bool known = false;
    for (int d = 0; d < 3 && !known; ++d) {
      const std::string prefix = prefixes[d];
      if (name.rfind(prefix, 0) != 0) continue;
      int64_t bucket = 0;
      if (!absl::SimpleAtoi(name.substr(prefix.size()), &bucket) || bucket < 0) {
        fail(absl::StrCat("'", name, "': the bucket index is not a number"));
      }
      dicts[d][bucket] = t.detach().clone();
      known = true;
    }
    if (!known) fail(absl::StrCat("unknown entry '", name, "'"));
  }
  // Where the buckets live: on the group's device, as the hook made them.
  for (auto& dict : dicts) {
    for (auto& [bucket, t] : dict) t = t.to(process_group_->device());
  }
  iter_ = iter;
  total_numel_before_compression_ = before;
  total_numel_after_compression_ = after;
  rng_ = rng;
  error_dict_ = std::move(dicts[0]);
  p_memory_dict_ = std::move(dicts[1]);
  q_memory_dict_ = std::move(dicts[2]);
}

void PowerSGDState::MaybeIncreaseIter(const GradBucket& bucket) {
  if (bucket.is_last()) ++iter_;
}

at::Tensor powerSGD_hook(PowerSGDState& state, GradBucket& bucket) {
  ProcessGroup& group = *state.process_group_;
  const PowerSGDOptions& o = state.options_;
  const int64_t world = group.world_size();
  at::Tensor input = bucket.buffer();
  // Vanilla all-reduce for the first start_powerSGD_iter iterations.
  if (state.iter_ < o.start_powerSGD_iter) {
    state.MaybeIncreaseIter(bucket);
    return allreduce_hook(group, bucket);
  }
  const at::TensorOptions opts = input.options();
  const int64_t index = bucket.index();
  at::Tensor input_cp;
  if (o.use_error_feedback) {
    // The local error of the last compression goes into this one.
    auto it = state.error_dict_.find(index);
    if (it != state.error_dict_.end()) {
      input.add_(it->second);
    } else {
      state.error_dict_[index] = at::zeros({input.size(0)}, opts);
    }
    input_cp = input.detach().clone();
  }

  // Which gradients to compress, each as a matrix (rows x the rest).
  std::vector<at::Tensor> matrices, uncompressed;
  int64_t total_ps = 0, total_qs = 0;
  for (const at::Tensor& tensor : bucket.gradients()) {
    at::Tensor matrix = tensor.view({tensor.dim() == 0 ? 1 : tensor.size(0), -1});
    const int64_t n = matrix.size(0), m = matrix.size(1);
    const int64_t rank = std::min({n, m, o.matrix_approximation_rank});
    const int64_t uncompressed_size = n * m, compressed_size = (n + m) * rank;
    state.total_numel_before_compression_ += uncompressed_size;
    if (static_cast<double>(compressed_size) * o.min_compression_rate <
        static_cast<double>(uncompressed_size)) {
      matrices.push_back(matrix);
      total_ps += n * rank;
      total_qs += m * rank;
      state.total_numel_after_compression_ += compressed_size;
    } else {
      uncompressed.push_back(tensor);
      state.total_numel_after_compression_ += uncompressed_size;
    }
  }
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : uncompressed) flat.push_back(t.view(-1));
  at::Tensor uncompressed_memory = flat.empty() ? at::empty({0}, opts) : at::cat(flat);

  bool need_randomize_qs = false;
  if (!o.warm_start || state.p_memory_dict_.count(index) == 0) {
    need_randomize_qs = true;
    state.p_memory_dict_[index] = at::empty({total_ps}, opts);
    state.q_memory_dict_[index] = at::empty({total_qs}, opts);
  }
  at::Tensor& p_memory = state.p_memory_dict_[index];
  at::Tensor& q_memory = state.q_memory_dict_[index];

  // Grouped by shape in order of first appearance (Python's defaultdict).
  std::vector<std::pair<std::vector<int64_t>, std::vector<at::Tensor>>> shape_to_tensors;
  for (const at::Tensor& m : matrices) {
    const std::vector<int64_t> shape = m.sizes().vec();
    auto it = std::find_if(shape_to_tensors.begin(), shape_to_tensors.end(),
                           [&](const auto& e) { return e.first == shape; });
    if (it == shape_to_tensors.end()) {
      shape_to_tensors.push_back({shape, {m}});
    } else {
      it->second.push_back(m);
    }
  }
  std::vector<at::Tensor> to_compress, ps, qs;
  int64_t p_idx = 0, q_idx = 0;
  for (const auto& [shape, tensors] : shape_to_tensors) {
    std::vector<at::Tensor> batches;
    if (o.batch_tensors_with_same_shape) {
      batches.push_back(tensors.size() == 1 ? tensors[0].unsqueeze(0) : at::stack(tensors));
    } else {
      for (const at::Tensor& t : tensors) batches.push_back(t.unsqueeze(0));
    }
    for (const at::Tensor& t : batches) {
      const int64_t batch = t.size(0), n = t.size(1), m = t.size(2);
      const int64_t rank = std::min({n, m, o.matrix_approximation_rank});
      to_compress.push_back(t);
      ps.push_back(p_memory.narrow(0, p_idx, batch * n * rank).view({batch, n, rank}));
      qs.push_back(q_memory.narrow(0, q_idx, batch * m * rank).view({batch, m, rank}));
      p_idx += batch * n * rank;
      q_idx += batch * m * rank;
    }
  }

  if (!need_randomize_qs) {
    for (const at::Tensor& q : qs) Orthogonalize(q, o.orthogonalization_epsilon);
  } else {
    // PyTorch: torch.manual_seed(state.rng.randint(1_000_000_000)) inside fork_rng, then
    // torch.randn per Q on the CPU. numpy's legacy randint below 2^32 draws 32-bit
    // outputs masked to the bound's bits until one fits; a generator of our own leaves
    // the global one alone, as fork_rng does.
    uint32_t seed;
    do {
      seed = static_cast<uint32_t>(state.rng_()) & 0x3FFFFFFFu;
    } while (seed > 999999999u);
    at::Generator gen = at::detail::createCPUGenerator(seed);
    for (const at::Tensor& q : qs) {
      q.copy_(at::randn(q.sizes(), gen, at::TensorOptions().dtype(q.scalar_type())));
      Orthogonalize(q, o.orthogonalization_epsilon);
    }
  }
  for (size_t k = 0; k < to_compress.size(); ++k) at::bmm_out(ps[k], to_compress[k], qs[k]);

  AllReduce(group, uncompressed_memory);
  uncompressed_memory.div_(world);
  int64_t idx = 0;
  for (const at::Tensor& t : uncompressed) {
    t.copy_(uncompressed_memory.narrow(0, idx, t.numel()).view_as(t));
    idx += t.numel();
  }
  AllReduce(group, p_memory);
  for (const at::Tensor& p : ps) Orthogonalize(p, o.orthogonalization_epsilon);
  for (size_t k = 0; k < to_compress.size(); ++k) {
    at::bmm_out(qs[k], to_compress[k].transpose(1, 2), ps[k]);
  }
  AllReduce(group, q_memory);
  q_memory.div_(world);
  for (size_t k = 0; k < to_compress.size(); ++k) {
    at::bmm_out(to_compress[k], ps[k], qs[k].transpose(1, 2));
  }
  if (o.batch_tensors_with_same_shape) {
    // Stacked batches are copies: write them back into the bucket's views.
    size_t k = 0;
    for (const auto& [shape, tensors] : shape_to_tensors) {
      const at::Tensor& t = to_compress[k++];
      if (t.size(0) == 1) continue;
      for (size_t i = 0; i < tensors.size(); ++i) tensors[i].copy_(t[static_cast<int64_t>(i)]);
    }
  }
  if (o.use_error_feedback) state.error_dict_[index] = input_cp - input;
  if (!o.warm_start) {
    state.p_memory_dict_.clear();
    state.q_memory_dict_.clear();
  }
  state.MaybeIncreaseIter(bucket);
  return input;
}

}  // namespace hooks
}  // namespace ddp
