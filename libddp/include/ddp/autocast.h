// ddp::Autocast: mixed precision as PyTorch's `torch.autocast(device_type, dtype)`.
//
//   {
//     ddp::Autocast autocast(group->device());          // bfloat16 by default
//     at::Tensor loss = loss_fn(model(x), y);           // matmuls, convolutions in bf16
//   }
//   loss.backward();                                    // outside, as in PyTorch
//   optimizer.step();                                   // fp32 parameters ("master weights")
//
// While an Autocast lives, this thread's operators run in the precision autocast's own
// lists give them (linear, conv and matmul in `dtype`; softmax, losses and reductions in
// fp32), exactly the kernels and casts `with torch.autocast(...)` uses; the parameters
// and their gradients stay fp32. Nesting restores the enclosing state, and the cast
// cache is cleared when the outermost one ends (PyTorch's __exit__). bf16 needs no loss
// scaling (its exponent range is fp32's); fp16 does, and is only offered on CUDA.
//
// Throws ddp::Error (kInvalidArgument) for a device other than the CPU or CUDA, a dtype
// other than bfloat16 or float16, or float16 on the CPU.
#ifndef DDP_AUTOCAST_H_
#define DDP_AUTOCAST_H_

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace ddp {

class Autocast {
 public:
  explicit Autocast(const c10::Device& device, c10::ScalarType dtype = c10::kBFloat16);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  c10::DeviceType device_type_;
  bool prev_enabled_;
  c10::ScalarType prev_dtype_;
  bool prev_cache_enabled_;
};

}  // namespace ddp

#endif  // DDP_AUTOCAST_H_
