// A tensor with its name in a model's state ("fc1.weight"): what the engine's
// checkpoints and recovery hold, and what trainer/model.h's models list.
#ifndef DDP_LIBDDP_ENGINE_NAMED_TENSOR_H_
#define DDP_LIBDDP_ENGINE_NAMED_TENSOR_H_

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>

namespace ddp {

using NamedTensor = std::pair<std::string, at::Tensor>;

}  // namespace ddp

#endif  // DDP_LIBDDP_ENGINE_NAMED_TENSOR_H_
