// The models ddp-trainer trains, behind one interface.
//
// Built-in models are torch::nn::Sequential stacks whose parameter names match the
// equivalent PyTorch nn.Sequential, so a checkpoint's "model" dict loads into the
// plain Python module with load_state_dict (docs/trainer.md lists the equivalents):
//   mlp: Sequential(Flatten, Linear(in, h0), ReLU, ..., Linear(h_last, out))
//   cnn: Sequential(Conv2d(c_in, c0, k, padding=k//2), ReLU, MaxPool2d(2), ...,
//                   Flatten, Linear(c_last*H'*W', hidden), ReLU, Linear(hidden, out))
// A TorchScript model is the user's own module (torch.jit.save), trained as is.
// gpt: GPT-2 with nanoGPT's names (trainer/gpt.h), on token windows.
// `out` is the number of classes for cross_entropy and 1 for mse / bce_with_logits.
#ifndef DDP_TRAINER_MODEL_H_
#define DDP_TRAINER_MODEL_H_

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/jobspec/job_spec.h"
#include "libddp/engine/named_tensor.h"
#include "trainer/dataset.h"

namespace ddp {

class Model {
 public:
  virtual ~Model() = default;
  virtual at::Tensor Forward(const at::Tensor& input) = 0;
  virtual void SetTraining(bool training) = 0;
  // In registration order, names without any wrapper prefix ("1.weight").
  virtual std::vector<NamedTensor> Parameters() = 0;
  virtual std::vector<NamedTensor> Buffers() = 0;
  // What checkpoints hold, as PyTorch's state_dict() lists it: the parameters and the
  // buffers, and a tied weight under each module's name (gpt's lm_head.weight).
  virtual std::vector<NamedTensor> StateDict() {
    std::vector<NamedTensor> out = Parameters();
    for (auto& b : Buffers()) out.push_back(std::move(b));
    return out;
  }
  virtual void To(const at::Device& device) = 0;
  // One line for logs: "mlp 30-64-32-2 (4,162 parameters)".
  virtual std::string Describe() = 0;
};

// Builds the model of `spec` for `data`, initialized by LibTorch's default init from
// the current global RNG state (the trainer seeds it with train.seed first), then
// checks one sample's output shape against `loss` (gpt: built to fit its token data,
// whose ids LoadData checked against model.gpt.vocab; no probe). INVALID_ARGUMENT (or NOT_FOUND for
// a missing TorchScript file) when the model cannot fit the data.
absl::StatusOr<std::unique_ptr<Model>> BuildModel(const ModelSpec& spec, const TrainValData& data,
                                                  LossKind loss);

int64_t CountParameters(Model& model);

}  // namespace ddp

#endif  // DDP_TRAINER_MODEL_H_
