// A user's LibTorch program on libddp's public API only: comm_hook_reference.py's setup,
// PyTorch DDP with a communication hook, whose per-step losses and hook bytes it must
// reproduce. Run one process per rank with torchrun's environment.
//
//   comm_hook_program --out FILE --hook none|fp16|bf16|powersgd|bad_shape
//       [--rank R] [--start S] [--error-feedback 0|1] [--warm-start 0|1] [--batch 0|1]
//       [--stop-after E --state PREFIX] [--resume PREFIX [--hook-state 0|1]]
//
// --stop-after E ends the run after epoch E, each rank saving the model, the optimizer
// and PowerSGDState::state_dict() to PREFIX.rank<R>.*; --resume PREFIX starts from
// those at epoch E + 1 (--hook-state 0: without PowerSGD's saved state, as a restart
// that lost it).
//
// Each rank writes FILE.rank<R>.json: {"losses": [...], "bytes": [...]}, per optimizer
// step the mean loss and the bytes this rank all-reduced in the step's sync backward.
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <string>

#include "test_model.h"

namespace {

using ddp_test::kN;  // The model and data: test_model.h.
constexpr int64_t kBatch = 6, kAccum = 2, kEpochs = 8;

int Run(int argc, char** argv) {
  std::map<std::string, std::string> flags = {{"--hook", "none"}, {"--rank", "1"},
                                               {"--start", "2"},   {"--error-feedback", "1"},
                                               {"--warm-start", "1"}, {"--batch", "0"},
                                               {"--stop-after", "-1"}, {"--hook-state", "1"}};
  for (int i = 1; i + 1 < argc; i += 2) flags[argv[i]] = argv[i + 1];
  const std::string hook = flags["--hook"];
  torch::set_num_threads(1);
  auto group = ddp::init_process_group();
  auto [net, x_all, y_all] = ddp_test::SeededNetAndData();

  ddp::DistributedDataParallel model(net, group);
  std::shared_ptr<ddp::hooks::PowerSGDState> powersgd;
  if (hook == "fp16") {
    model.register_comm_hook(group, ddp::hooks::fp16_compress_hook);
  } else if (hook == "bf16") {
    model.register_comm_hook(group, ddp::hooks::bf16_compress_hook);
  } else if (hook == "powersgd") {
    ddp::hooks::PowerSGDOptions o;
    o.matrix_approximation_rank = std::atoll(flags["--rank"].c_str());
    o.start_powerSGD_iter = std::atoll(flags["--start"].c_str());
    o.use_error_feedback = flags["--error-feedback"] == "1";
    o.warm_start = flags["--warm-start"] == "1";
    o.batch_tensors_with_same_shape = flags["--batch"] == "1";
    powersgd = std::make_shared<ddp::hooks::PowerSGDState>(group, o);
    model.register_comm_hook(powersgd, ddp::hooks::powerSGD_hook);
  } else if (hook == "bad_shape") {  // Misuse: a hook that returns half the buffer.
    model.register_comm_hook([](ddp::GradBucket& bucket) {
      return bucket.buffer().narrow(0, 0, bucket.buffer().numel() / 2);
    });
  } else if (hook != "none") {
    std::cerr << "comm_hook_program: unknown --hook " << hook << "\n";
    return 2;
  }
  torch::optim::SGD opt(model.module()->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  ddp::DistributedSampler sampler(kN, *group, /*shuffle=*/true, /*seed=*/0);
  const int64_t micro = (sampler.size() + kBatch - 1) / kBatch;
  const int64_t steps = (micro + kAccum - 1) / kAccum;
  std::vector<double> losses;
  std::vector<int64_t> bytes;
  const std::string rank_suffix = ".rank" + std::to_string(group->rank());
  int64_t first_epoch = 0;
  if (flags.count("--resume")) {
    const std::string prefix = flags["--resume"] + rank_suffix;
    torch::serialize::InputArchive archive;
    archive.load_from(prefix + ".pt");
    torch::Tensor epoch;
    archive.read("epoch", epoch);
    first_epoch = epoch.item<int64_t>() + 1;
    torch::serialize::InputArchive model_archive, opt_archive;
    archive.read("model", model_archive);
    archive.read("optimizer", opt_archive);
    model.module()->load(model_archive);
    opt.load(opt_archive);
    if (powersgd && flags["--hook-state"] == "1") {
      torch::serialize::InputArchive hook_archive;
      archive.read("powersgd", hook_archive);
      std::vector<std::pair<std::string, torch::Tensor>> state;
      for (const std::string& key : hook_archive.keys()) {
        torch::Tensor t;
        hook_archive.read(key, t);
        state.emplace_back(key, t);
      }
      powersgd->load_state_dict(state);
    }
  }
  const int64_t stop_after = std::atoll(flags["--stop-after"].c_str());
  for (int64_t epoch = first_epoch; epoch < kEpochs; ++epoch) {
    sampler.set_epoch(epoch);
    const std::vector<int64_t> order = sampler.indices();
    model.train();
    for (int64_t step = 0; step < steps; ++step) {
      const int64_t first = step * kAccum;
      const int64_t n = std::min(kAccum, micro - first);
      double total = 0;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t begin = (first + j) * kBatch;
        const int64_t end = std::min<int64_t>(begin + kBatch, static_cast<int64_t>(order.size()));
        torch::Tensor idx = torch::tensor(std::vector<int64_t>(order.begin() + begin,
                                                               order.begin() + end));
        auto no_sync = j < n - 1 ? std::optional(model.no_sync()) : std::nullopt;
        torch::Tensor loss = torch::nn::functional::cross_entropy(model(x_all.index_select(0, idx)),
                                                                  y_all.index_select(0, idx));
        (loss / static_cast<double>(n)).backward();
        total += loss.item<double>();
      }
      opt.step();
      opt.zero_grad();
      losses.push_back(total / static_cast<double>(n));
      bytes.push_back(model.last_backward().allreduce_bytes);
    }
    if (epoch == stop_after) {
      torch::serialize::OutputArchive archive, model_archive, opt_archive, hook_archive;
      archive.write("epoch", torch::tensor(epoch));
      model.module()->save(model_archive);
      opt.save(opt_archive);
      archive.write("model", model_archive);
      archive.write("optimizer", opt_archive);
      if (powersgd) {
        for (const auto& [key, t] : powersgd->state_dict()) hook_archive.write(key, t);
        archive.write("powersgd", hook_archive);
      }
      archive.save_to(flags["--state"] + rank_suffix + ".pt");
      break;
    }
  }
  group->barrier();
  std::ofstream out(flags["--out"] + ".rank" + std::to_string(group->rank()) + ".json");
  out.precision(17);
  out << "{\"losses\": [";
  for (size_t i = 0; i < losses.size(); ++i) out << (i ? ", " : "") << losses[i];
  out << "], \"bytes\": [";
  for (size_t i = 0; i < bytes.size(); ++i) out << (i ? ", " : "") << bytes[i];
  out << "]";
  if (powersgd) out << ", \"iter\": " << powersgd->iter();
  out << "}\n";
  return out.good() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const ddp::Error& e) {
    std::cerr << "comm_hook_program: " << e.what() << "\n";
    return e.exit_code();
  }
}
