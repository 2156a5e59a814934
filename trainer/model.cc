#include "trainer/model.h"

#include <torch/nn.h>
#include <torch/script.h>

#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "trainer/gpt.h"

namespace ddp {
namespace {

class SequentialModel : public Model {
 public:
  SequentialModel(torch::nn::Sequential net, std::string description)
      : net_(std::move(net)), description_(std::move(description)) {}

  at::Tensor Forward(const at::Tensor& input) override { return net_->forward(input); }
  void SetTraining(bool training) override { net_->train(training); }
  std::vector<NamedTensor> Parameters() override {
    std::vector<NamedTensor> out;
    for (const auto& item : net_->named_parameters(/*recurse=*/true)) {
      out.emplace_back(item.key(), item.value());
    }
    return out;
  }
  std::vector<NamedTensor> Buffers() override {
    std::vector<NamedTensor> out;
    for (const auto& item : net_->named_buffers(/*recurse=*/true)) {
      out.emplace_back(item.key(), item.value());
    }
    return out;
  }
  void To(const at::Device& device) override { net_->to(device); }
  std::string Describe() override {
    return absl::StrCat(description_, " (", CountParameters(*this), " parameters)");
  }

 private:
  torch::nn::Sequential net_;
  std::string description_;
};

class ScriptModel : public Model {
 public:
  ScriptModel(torch::jit::Module module, std::string path)
      : module_(std::move(module)), path_(std::move(path)) {}

  at::Tensor Forward(const at::Tensor& input) override {
    return module_.forward({input}).toTensor();
  }
  void SetTraining(bool training) override { module_.train(training); }
  std::vector<NamedTensor> Parameters() override {
    std::vector<NamedTensor> out;
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
      out.emplace_back(p.name, p.value);
    }
    return out;
  }
  std::vector<NamedTensor> Buffers() override {
    std::vector<NamedTensor> out;
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) {
      out.emplace_back(b.name, b.value);
    }
    return out;
  }
  void To(const at::Device& device) override { module_.to(device); }
  std::string Describe() override {
    return absl::StrCat("torchscript ", path_, " (", CountParameters(*this), " parameters)");
  }

 private:
  torch::jit::Module module_;
  std::string path_;
};

int64_t OutputsFor(LossKind loss, int64_t num_classes) {
  return loss == LossKind::kCrossEntropy ? num_classes : 1;
}

std::unique_ptr<Model> BuildMlp(const MlpSpec& spec, const TrainValData& data, int64_t out) {
  int64_t in = 1;
  for (int64_t d : data.sample_shape) in *= d;
  torch::nn::Sequential net;
  net->push_back(torch::nn::Flatten());
  std::vector<int64_t> widths = {in};
  for (int64_t h : spec.hidden) {
    net->push_back(torch::nn::Linear(widths.back(), h));
    net->push_back(torch::nn::ReLU());
    widths.push_back(h);
  }
  net->push_back(torch::nn::Linear(widths.back(), out));
  widths.push_back(out);
  return std::make_unique<SequentialModel>(net, absl::StrCat("mlp ", absl::StrJoin(widths, "-")));
}

absl::StatusOr<std::unique_ptr<Model>> BuildCnn(const CnnSpec& spec, const TrainValData& data,
                                                int64_t out) {
  if (data.sample_shape.size() != 3) {
    return absl::InvalidArgumentError("model.cnn: needs images [C, H, W] (data.idx)");
  }
  int64_t c = data.sample_shape[0], h = data.sample_shape[1], w = data.sample_shape[2];
  torch::nn::Sequential net;
  for (int64_t ch : spec.channels) {
    net->push_back(torch::nn::Conv2d(
        torch::nn::Conv2dOptions(c, ch, spec.kernel).padding(spec.kernel / 2)));
    net->push_back(torch::nn::ReLU());
    net->push_back(torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2)));
    c = ch;
    h /= 2;
    w /= 2;
    if (h == 0 || w == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.cnn.channels: ", spec.channels.size(), " pooling stages shrink ",
          data.sample_shape[1], "x", data.sample_shape[2], " images to nothing"));
    }
  }
  net->push_back(torch::nn::Flatten());
  net->push_back(torch::nn::Linear(c * h * w, spec.hidden));
  net->push_back(torch::nn::ReLU());
  net->push_back(torch::nn::Linear(spec.hidden, out));
  return std::make_unique<SequentialModel>(
      net, absl::StrCat("cnn channels=[", absl::StrJoin(spec.channels, ","), "] kernel=",
                        spec.kernel, " hidden=", spec.hidden, " out=", out));
}

absl::StatusOr<std::unique_ptr<Model>> LoadScript(const TorchScriptSpec& spec) {
  if (!std::ifstream(spec.path)) {
    return absl::NotFoundError(absl::StrCat("model.torchscript.path: cannot open '", spec.path,
                                            "' (relative paths resolve in the job's workdir)"));
  }
  try {
    torch::jit::Module m = torch::jit::load(spec.path);
    return std::make_unique<ScriptModel>(std::move(m), spec.path);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("model.torchscript.path: '", spec.path,
                                                   "' is not a TorchScript module: ", e.what()));
  }
}

}  // namespace

int64_t CountParameters(Model& model) {
  int64_t n = 0;
  for (const auto& [name, p] : model.Parameters()) n += p.numel();
  return n;
}

absl::StatusOr<std::unique_ptr<Model>> BuildModel(const ModelSpec& spec, const TrainValData& data,
                                                  LossKind loss) {
  const int64_t out = OutputsFor(loss, data.num_classes);
  std::unique_ptr<Model> model;
  switch (spec.kind) {
    case ModelSpec::Kind::kMlp:
      model = BuildMlp(spec.mlp, data, out);
      break;
    case ModelSpec::Kind::kCnn: {
      auto m = BuildCnn(spec.cnn, data, out);
      if (!m.ok()) return m.status();
      model = std::move(*m);
      break;
    }
    case ModelSpec::Kind::kTorchScript: {
      auto m = LoadScript(spec.torchscript);
      if (!m.ok()) return m.status();
      model = std::move(*m);
      break;
    }
    case ModelSpec::Kind::kGpt:
      // Its vocabulary and context are the data's by construction (job.yaml ties
      // model.gpt to data.tokens); a probe forward of seq_len tokens could take seconds.
      return BuildGpt(spec.gpt);
  }
  if (model->Parameters().empty()) {
    return absl::InvalidArgumentError("model: has no parameters to train");
  }
  // One sample through the model in eval mode (no RNG use): fail early and clearly
  // when the model does not fit the data instead of inside the first step.
  at::Tensor probe = data.train.features.narrow(0, 0, 1);
  at::Tensor y;
  try {
    at::NoGradGuard no_grad;
    model->SetTraining(false);
    y = model->Forward(probe);
    model->SetTraining(true);
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    return absl::InvalidArgumentError(absl::StrCat("model: forward of one sample of shape [",
                                                   absl::StrJoin(data.sample_shape, ", "),
                                                   "] failed: ", what));
  }
  const bool ok = loss == LossKind::kCrossEntropy
                      ? (y.dim() == 2 && y.size(1) == out)
                      : (y.numel() == 1);
  if (!ok) {
    std::vector<int64_t> shape(y.sizes().begin(), y.sizes().end());
    return absl::InvalidArgumentError(absl::StrCat(
        "model: output of shape [", absl::StrJoin(shape, ", "), "] for one sample does not fit ",
        LossName(loss), loss == LossKind::kCrossEntropy
                            ? absl::StrCat(" with ", out, " classes (expected [1, ", out, "])")
                            : std::string(" (expected one value per sample)")));
  }
  return model;
}

}  // namespace ddp
