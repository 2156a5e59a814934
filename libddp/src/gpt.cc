#include "ddp/gpt.h"

#include <ATen/core/grad_mode.h>
#include <torch/version.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "libddp/src/api_bridge.h"

namespace ddp {
namespace {

// The tensors of one transformer block, named as nanoGPT's Block's parameters.
struct Block {
  at::Tensor ln_1_w, ln_1_b;
  at::Tensor c_attn_w, c_attn_b;  // [3C, C], [3C]: q, k and v in one matmul
  at::Tensor attn_proj_w, attn_proj_b;
  at::Tensor ln_2_w, ln_2_b;
  at::Tensor c_fc_w, c_fc_b;
  at::Tensor mlp_proj_w, mlp_proj_b;
};

// The random draws of PyTorch's module constructors, on the CPU generator.
// nn.Embedding.reset_parameters: init.normal_(weight).
at::Tensor NewEmbedding(int64_t rows, int64_t dim) { return at::empty({rows, dim}).normal_(0, 1); }

// nn.Linear.reset_parameters: kaiming_uniform_(weight, a=sqrt(5)), then the bias
// uniform in +-1/sqrt(fan_in), computed as torch.nn.init computes them.
at::Tensor NewLinear(int64_t out, int64_t in, at::Tensor* bias) {
  at::Tensor w = at::empty({out, in});
  const double gain = std::sqrt(2.0 / (1 + 5.0));  // calculate_gain('leaky_relu', sqrt(5))
  const double bound = std::sqrt(3.0) * (gain / std::sqrt(static_cast<double>(in)));
  w.uniform_(-bound, bound);
  if (bias != nullptr) {
    const double b = 1 / std::sqrt(static_cast<double>(in));
    *bias = at::empty({out}).uniform_(-b, b);
  }
  return w;
}

}  // namespace

struct GPT::Impl {
  explicit Impl(const GPTConfig& c) : config(c) {
    at::NoGradGuard no_grad;
    Construct();
    InitWeights();
    for (auto& [name, p] : Parameters()) p.requires_grad_(true);
#if TORCH_VERSION_MAJOR < 2
    // nanoGPT's mask where PyTorch has no scaled_dot_product_attention: the positions a
    // query may not see (above the diagonal), as `tril(ones) == 0`.
    future = at::ones({config.seq_len, config.seq_len}, at::kBool).triu(1);
#endif
    positions = at::arange(config.seq_len, at::kLong);
  }

  at::Tensor Forward(const at::Tensor& idx) const {
    const int64_t b = idx.size(0), t = idx.size(1), c = config.dim;
    TORCH_CHECK(t <= config.seq_len, "GPT: a sequence of ", t,
                " tokens is longer than seq_len ", config.seq_len);
    at::Tensor x = at::embedding(wte, idx) + at::embedding(wpe, positions.narrow(0, 0, t));
    x = Dropout(x);
    for (const Block& blk : blocks) {
      x = x + Attention(blk, at::layer_norm(x, {c}, blk.ln_1_w, blk.ln_1_b, 1e-5), b, t);
      x = x + Mlp(blk, at::layer_norm(x, {c}, blk.ln_2_w, blk.ln_2_b, 1e-5));
    }
    x = at::layer_norm(x, {c}, ln_f_w, ln_f_b, 1e-5);
    return at::linear(x, head);  // [B, T, vocab]
  }

  std::vector<std::pair<std::string, at::Tensor>> Parameters() const {
    std::vector<std::pair<std::string, at::Tensor>> out = {{"transformer.wte.weight", wte},
                                                           {"transformer.wpe.weight", wpe}};
    for (size_t i = 0; i < blocks.size(); ++i) {
      const Block& b = blocks[i];
      const std::string h = absl::StrCat("transformer.h.", i, ".");
      out.emplace_back(h + "ln_1.weight", b.ln_1_w);
      out.emplace_back(h + "ln_1.bias", b.ln_1_b);
      out.emplace_back(h + "attn.c_attn.weight", b.c_attn_w);
      out.emplace_back(h + "attn.c_attn.bias", b.c_attn_b);
      out.emplace_back(h + "attn.c_proj.weight", b.attn_proj_w);
      out.emplace_back(h + "attn.c_proj.bias", b.attn_proj_b);
      out.emplace_back(h + "ln_2.weight", b.ln_2_w);
      out.emplace_back(h + "ln_2.bias", b.ln_2_b);
      out.emplace_back(h + "mlp.c_fc.weight", b.c_fc_w);
      out.emplace_back(h + "mlp.c_fc.bias", b.c_fc_b);
      out.emplace_back(h + "mlp.c_proj.weight", b.mlp_proj_w);
      out.emplace_back(h + "mlp.c_proj.bias", b.mlp_proj_b);
    }
    out.emplace_back("transformer.ln_f.weight", ln_f_w);
    out.emplace_back("transformer.ln_f.bias", ln_f_b);
    if (!config.tie_weights) out.emplace_back("lm_head.weight", head);
    return out;
  }

  // Module construction in nanoGPT's order: wte, wpe, each block's c_attn, c_proj, c_fc
  // and c_proj (LayerNorms draw nothing), then lm_head; the tie drops wte's own tensor.
  void Construct() {
    const int64_t c = config.dim;
    wte = NewEmbedding(config.vocab, c);
    wpe = NewEmbedding(config.seq_len, c);
    blocks.resize(static_cast<size_t>(config.layers));
    for (Block& b : blocks) {
      b.ln_1_w = at::ones({c});
      b.ln_1_b = at::zeros({c});
      b.c_attn_w = NewLinear(3 * c, c, &b.c_attn_b);
      b.attn_proj_w = NewLinear(c, c, &b.attn_proj_b);
      b.ln_2_w = at::ones({c});
      b.ln_2_b = at::zeros({c});
      b.c_fc_w = NewLinear(4 * c, c, &b.c_fc_b);
      b.mlp_proj_w = NewLinear(c, 4 * c, &b.mlp_proj_b);
    }
    ln_f_w = at::ones({c});
    ln_f_b = at::zeros({c});
    head = NewLinear(config.vocab, c, nullptr);
    if (config.tie_weights) wte = head;
  }

  // GPT._init_weights through Module.apply (children first, in registration order),
  // then the residual projections' GPT-2 init in named_parameters() order.
  void InitWeights() {
    wte.normal_(0.0, 0.02);
    wpe.normal_(0.0, 0.02);
    for (Block& b : blocks) {
      for (at::Tensor* w : {&b.c_attn_w, &b.attn_proj_w, &b.c_fc_w, &b.mlp_proj_w}) {
        w->normal_(0.0, 0.02);
      }
      for (at::Tensor* bias : {&b.c_attn_b, &b.attn_proj_b, &b.c_fc_b, &b.mlp_proj_b}) {
        bias->zero_();
      }
    }
    head.normal_(0.0, 0.02);  // Tied: wte's tensor again, this draw wins.
    const double std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.layers));
    for (Block& b : blocks) {
      b.attn_proj_w.normal_(0.0, std);
      b.mlp_proj_w.normal_(0.0, std);
    }
  }

  at::Tensor Dropout(const at::Tensor& x) const {
    // p = 0 (or eval) returns x itself in at::dropout too: skipped, no kernel, no draw.
    if (!training || config.dropout == 0) return x;
    return at::dropout(x, config.dropout, /*train=*/true);
  }

  at::Tensor Attention(const Block& blk, const at::Tensor& h, int64_t b, int64_t t) const {
    const int64_t c = config.dim, heads = config.heads, d = c / heads;
    // One matmul for q, k and v; the heads are views of it.
    std::vector<at::Tensor> qkv = at::linear(h, blk.c_attn_w, blk.c_attn_b).split(c, 2);
    at::Tensor q = qkv[0].view({b, t, heads, d}).transpose(1, 2);
    at::Tensor k = qkv[1].view({b, t, heads, d}).transpose(1, 2);
    at::Tensor v = qkv[2].view({b, t, heads, d}).transpose(1, 2);
    at::Tensor y;
#if TORCH_VERSION_MAJOR >= 2
    y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{},
                                         training ? config.dropout : 0.0, /*is_causal=*/true);
#else
    at::Tensor att = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(d)));
    att = att.masked_fill(future.narrow(0, 0, t).narrow(1, 0, t), -INFINITY);
    att = Dropout(at::softmax(att, -1));
    y = at::matmul(att, v);
#endif
    y = y.transpose(1, 2).contiguous().view({b, t, c});
    return Dropout(at::linear(y, blk.attn_proj_w, blk.attn_proj_b));
  }

  at::Tensor Mlp(const Block& blk, const at::Tensor& h) const {
    at::Tensor x = at::gelu(at::linear(h, blk.c_fc_w, blk.c_fc_b), "tanh");
    return Dropout(at::linear(x, blk.mlp_proj_w, blk.mlp_proj_b));
  }

  const GPTConfig config;
  bool training = true;
  at::Tensor wte, wpe;
  std::vector<Block> blocks;
  at::Tensor ln_f_w, ln_f_b;
  at::Tensor head;       // lm_head.weight; wte itself when tied.
  at::Tensor positions;  // arange(seq_len) on the model's device, narrowed per forward.
  at::Tensor future;     // LibTorch 1.13's causal mask: true above the diagonal.
};

namespace {

GPTConfig Checked(const GPTConfig& c) {
  std::string why;
  if (c.layers < 1 || c.heads < 1 || c.dim < 1 || c.seq_len < 1 || c.vocab < 1) {
    why = "layers, heads, dim, seq_len and vocab must be at least 1";
  } else if (c.dim % c.heads != 0) {
    why = absl::StrCat("dim ", c.dim, " is not a multiple of heads ", c.heads);
  } else if (!(c.dropout >= 0 && c.dropout < 1)) {
    why = absl::StrCat("dropout ", c.dropout, " is not in [0, 1)");
  }
  if (!why.empty()) ThrowIfError(absl::InvalidArgumentError(absl::StrCat("GPTConfig: ", why)));
  return c;
}

}  // namespace

GPT::GPT(const GPTConfig& config) : impl_(std::make_unique<Impl>(Checked(config))) {}
GPT::~GPT() = default;
GPT::GPT(GPT&&) noexcept = default;
GPT& GPT::operator=(GPT&&) noexcept = default;

at::Tensor GPT::forward(const at::Tensor& idx) const { return impl_->Forward(idx); }
void GPT::train(bool on) { impl_->training = on; }
bool GPT::is_training() const { return impl_->training; }

void GPT::to(const at::Device& device) {
  for (auto& [name, p] : impl_->Parameters()) p.set_data(p.data().to(device));
  if (impl_->future.defined()) impl_->future = impl_->future.to(device);
  impl_->positions = impl_->positions.to(device);
}

std::vector<std::pair<std::string, at::Tensor>> GPT::named_parameters() const {
  return impl_->Parameters();
}

std::vector<std::pair<std::string, at::Tensor>> GPT::state_dict() const {
  auto out = impl_->Parameters();
  if (impl_->config.tie_weights) out.emplace_back("lm_head.weight", impl_->head);
  return out;
}

const GPTConfig& GPT::config() const { return impl_->config; }

int64_t GPT::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, p] : impl_->Parameters()) n += p.numel();
  return n;
}

double GPT::flops_per_token() const {
  const GPTConfig& c = impl_->config;
  return 6.0 * static_cast<double>(num_parameters()) +
         12.0 * static_cast<double>(c.layers * c.dim * c.seq_len);
}

}  // namespace ddp
