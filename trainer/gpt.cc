#include "trainer/gpt.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ddp/gpt.h"

namespace ddp {
namespace {

// model.gpt: libddp's GPT (<ddp/gpt.h>, the model a LibTorch program gets too) behind the
// trainer's Model interface.
class Gpt : public Model {
 public:
  explicit Gpt(const GptSpec& spec) : gpt_(ConfigOf(spec)) {}

  at::Tensor Forward(const at::Tensor& idx) override { return gpt_.forward(idx); }
  void SetTraining(bool training) override { gpt_.train(training); }
  std::vector<NamedTensor> Parameters() override { return gpt_.named_parameters(); }
  std::vector<NamedTensor> Buffers() override { return {}; }
  // PyTorch's state_dict() names a tied weight under both modules (decision 169).
  std::vector<NamedTensor> StateDict() override { return gpt_.state_dict(); }
  void To(const at::Device& device) override { gpt_.to(device); }
  std::string Describe() override {
    const GPTConfig& c = gpt_.config();
    return absl::StrCat("gpt layers=", c.layers, " heads=", c.heads, " dim=", c.dim,
                        " seq_len=", c.seq_len, " vocab=", c.vocab,
                        c.tie_weights ? " tied" : " untied", " (", CountParameters(*this),
                        " parameters)");
  }

 private:
  static GPTConfig ConfigOf(const GptSpec& spec) {
    GPTConfig c;
    c.layers = spec.layers;
    c.heads = spec.heads;
    c.dim = spec.dim;
    c.seq_len = spec.seq_len;
    c.vocab = spec.vocab;
    c.dropout = spec.dropout;
    c.tie_weights = spec.tie_weights;
    return c;
  }

  GPT gpt_;
};

}  // namespace

std::unique_ptr<Model> BuildGpt(const GptSpec& spec) { return std::make_unique<Gpt>(spec); }

}  // namespace ddp
