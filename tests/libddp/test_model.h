// The model and data of libddp's parity programs (parity_program.cc,
// comm_hook_program.cc), on the public API only: a small BatchNorm MLP with a frozen
// parameter and seeded random data. Its PyTorch twin is test_model.py, which the
// programs' references (parity_reference.py, comm_hook_reference.py) train under
// PyTorch's own DDP: the two must stay the same module for module and seed for seed.
#ifndef DDP_TESTS_LIBDDP_TEST_MODEL_H_
#define DDP_TESTS_LIBDDP_TEST_MODEL_H_

#include <torch/torch.h>

namespace ddp_test {

constexpr int64_t kN = 46, kFeatures = 10, kClasses = 3;

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(kFeatures, 16));
    bn = register_module("bn", torch::nn::BatchNorm1d(16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 16));
    head = register_module("head", torch::nn::Linear(16, kClasses));
    fc1->bias.set_requires_grad(false);  // The frozen parameter.
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(bn(fc1(x)));
    return head(torch::relu(fc2(h)));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, head{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(Net);

// The model initialized under seed 0 and the kN samples (kFeatures features, labels in
// [0, kClasses)) drawn under seed 1, as test_model.py's seeded_net_and_data().
struct Seeded {
  Net net{nullptr};
  torch::Tensor x, y;
};
inline Seeded SeededNetAndData() {
  Seeded s;
  torch::manual_seed(0);
  s.net = Net();
  torch::manual_seed(1);
  s.x = torch::randn({kN, kFeatures});
  s.y = torch::randint(0, kClasses, {kN});
  return s;
}

}  // namespace ddp_test

#endif  // DDP_TESTS_LIBDDP_TEST_MODEL_H_
