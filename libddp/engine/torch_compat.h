// The one place where LibTorch versions differ for ddp-trainer.
//
// Built against Debian's LibTorch 1.13 (CPU) and against LibTorch 2.x (CUDA, e.g. the
// one inside a pip torch). Differences handled here:
//   - c10d collectives: 1.13's ProcessGroupGloo/NCCL derive from c10d::ProcessGroup;
//     2.x's derive from c10d::Backend. Both expose the same allreduce/broadcast/barrier
//     signatures, so the trainer talks to `CommBackend`.
//   - torch::optim state: keyed by std::string (the TensorImpl address printed) in
//     1.13 and by void* in 2.x; OptimizerStateKey() makes the right key.
#ifndef DDP_LIBDDP_ENGINE_TORCH_COMPAT_H_
#define DDP_LIBDDP_ENGINE_TORCH_COMPAT_H_

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/optim/optimizer.h>
#include <torch/version.h>

#include <sstream>
#include <string>
#include <type_traits>

namespace ddp {

#if TORCH_VERSION_MAJOR >= 2
using CommBackend = ::c10d::Backend;
#else
using CommBackend = ::c10d::ProcessGroup;
#endif

using CommBackendPtr = c10::intrusive_ptr<CommBackend>;

// The key under which `optimizer` keeps the state of parameter `p`.
// (A template, so that only the branch of the LibTorch at hand is instantiated.)
template <typename Optimizer = torch::optim::Optimizer>
auto OptimizerStateKey(const Optimizer& optimizer, const at::Tensor& p) {
  using Key = typename std::remove_cv_t<
      std::remove_reference_t<decltype(optimizer.state())>>::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;  // What c10::guts::to_string(TensorImpl*) prints.
    key << p.unsafeGetTensorImpl();
    return key.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

}  // namespace ddp

#endif  // DDP_LIBDDP_ENGINE_TORCH_COMPAT_H_
