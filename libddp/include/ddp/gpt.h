// ddp::GPT: GPT-2 as nanoGPT's model.py writes it, for LibTorch programs (examples/gpt/)
// and ddp-trainer's model.gpt alike.
//
//   torch::manual_seed(0);                        // nanoGPT's weights for this seed
//   ddp::GPT gpt(ddp::GPTConfig{});               // GPT-2 124M, on the CPU
//   ddp::DataParallel model(gpt.named_parameters(), {}, group);   // after gpt.to(device)
//   at::Tensor logits = gpt.forward(idx);         // idx [B, T] int64 -> [B, T, vocab]
//
//   x = drop(wte(idx) + wpe(arange(T)))
//   each block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))
//     attn: c_attn (one [3C, C] matmul for q, k, v), causal attention over `heads` heads,
//           c_proj, dropout;  mlp: c_fc [4C, C], GELU (tanh), c_proj [C, 4C], dropout
//   logits = lm_head(ln_f(x))      lm_head.weight is wte.weight when tie_weights
//
// Parameter names are nanoGPT's ("transformer.h.0.attn.c_attn.weight"), in the order
// PyTorch's named_parameters() lists them (a tied head once, as transformer.wte.weight);
// state_dict() also names a tied head as "lm_head.weight", as PyTorch's does, so it loads
// into nanoGPT's GPT with load_state_dict(strict=True). The initial weights are nanoGPT's
// after the same torch.manual_seed, bit for bit: the random draws of module construction
// (each nn.Embedding's normal_, each nn.Linear's kaiming_uniform_ and bias uniform_), in
// construction order, then those of apply(_init_weights) (children before parents: a tied
// weight is drawn twice, the head's draw wins), then the c_proj weights' scaled re-draw.
// Attention: LibTorch 2.x's scaled_dot_product_attention(is_causal) (flash attention on a
// GPU in bf16); with 1.13 the masked softmax nanoGPT falls back to. No host
// synchronization in forward(): it can be captured in a CUDA graph (<ddp/cuda_graph.h>).
#ifndef DDP_GPT_H_
#define DDP_GPT_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

struct GPTConfig {
  int64_t layers = 12;
  int64_t heads = 12;
  int64_t dim = 768;        // A multiple of heads.
  int64_t seq_len = 1024;   // The longest sequence (nanoGPT's block_size).
  int64_t vocab = 50304;
  double dropout = 0.0;
  bool tie_weights = true;  // lm_head.weight is wte.weight.
};

class GPT {
 public:
  // Builds the model on the CPU from the global generator's current state. Throws
  // ddp::Error (kInvalidArgument) for a config that is not a model (dim % heads != 0, a
  // size below 1, dropout outside [0, 1)).
  explicit GPT(const GPTConfig& config);
  ~GPT();
  GPT(GPT&&) noexcept;
  GPT& operator=(GPT&&) noexcept;

  // idx [B, T] int64 token ids (T <= seq_len) -> logits [B, T, vocab].
  at::Tensor forward(const at::Tensor& idx) const;
  // Dropout on (train) or off (eval).
  void train(bool on = true);
  bool is_training() const;
  // As nn.Module.to: every parameter's data moves, the parameters (and the tie) stay.
  void to(const at::Device& device);

  std::vector<std::pair<std::string, at::Tensor>> named_parameters() const;
  // named_parameters() plus "lm_head.weight" when tied (PyTorch's state_dict()).
  std::vector<std::pair<std::string, at::Tensor>> state_dict() const;
  const GPTConfig& config() const;
  int64_t num_parameters() const;
  // The design's MFU numerator: 6 N + 12 layers dim seq_len FLOPs per token trained.
  double flops_per_token() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp

#endif  // DDP_GPT_H_
