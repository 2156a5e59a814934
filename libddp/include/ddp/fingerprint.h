// ddp::fingerprint: a short hash of tensors' bytes, to check that replicas agree (every
// rank of a DDP job holds the same parameters after each step, a replacement after a
// live recovery holds the survivors' state, a resumed run ends where an uninterrupted
// one ends).
#ifndef DDP_FINGERPRINT_H_
#define DDP_FINGERPRINT_H_

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace ddp {

// FNV-1a (64 bits) over the bytes of `tensors` in order, each copied to the CPU and
// made contiguous first, as 16 lowercase hex digits. Equal exactly when the tensors are
// bit for bit the same (barring a hash collision), whatever device they are on; their
// shapes and dtypes are not hashed, only their bytes. Costs a copy to the CPU of every
// tensor not already there: for checks, not for every step of a large model.
// ddp-trainer's `params_fingerprint` (its `done` and trace events) is this over the
// model's parameters.
std::string fingerprint(const std::vector<at::Tensor>& tensors);

}  // namespace ddp

#endif  // DDP_FINGERPRINT_H_
