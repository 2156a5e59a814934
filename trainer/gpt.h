// model.gpt: GPT-2 as nanoGPT's model.py writes it (tests/reference/nanogpt.py is the
// PyTorch reference, and docs/trainer.md describes both).
//
//   x = drop(wte(idx) + wpe(arange(T)))
//   each block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))
//     attn: c_attn (one [3C, C] matmul for q, k, v), causal attention over `heads` heads,
//           c_proj, dropout;  mlp: c_fc [4C, C], GELU (tanh), c_proj [C, 4C], dropout
//   logits = lm_head(ln_f(x))      lm_head.weight is wte.weight when tie_weights
//
// Parameter names are nanoGPT's ("transformer.h.0.attn.c_attn.weight"), in the order
// PyTorch's named_parameters() lists them (a tied head once, as transformer.wte.weight).
// The initial weights are nanoGPT's after the same torch.manual_seed, bit for bit: the
// random draws of module construction (each nn.Embedding's normal_, each nn.Linear's
// kaiming_uniform_ and bias uniform_) are made, in construction order, then the draws of
// apply(_init_weights) (children before parents: a tied weight is drawn twice, the
// head's draw wins), then the c_proj weights' scaled re-draw (decision 168).
// Attention: LibTorch 2.x's scaled_dot_product_attention(is_causal) (flash attention on
// a GPU in bf16); with 1.13 the masked softmax nanoGPT falls back to.
#ifndef DDP_TRAINER_GPT_H_
#define DDP_TRAINER_GPT_H_

#include <memory>

#include "common/jobspec/job_spec.h"
#include "trainer/model.h"

namespace ddp {

// Builds `spec`'s GPT on the CPU from the global generator's current state (the
// trainer seeds it with train.seed first).
std::unique_ptr<Model> BuildGpt(const GptSpec& spec);

}  // namespace ddp

#endif  // DDP_TRAINER_GPT_H_
