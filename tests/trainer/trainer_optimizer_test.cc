// train.optimizer.fused (decision 170) and train.optimizer.weight_decay_params
// (decision 172): real ddp-trainer ranks against PyTorch's own DDP on the same job
// (scripts/pytorch_ddp_reference.py, run live by the flavour's Python: PyTorch 1.13 in
// build/, 2.x in build-torch2/):
//   - fused: true (torch.optim's fused=True on both sides) on 2 ranks, under 2.x;
//     refused by name under 1.13, which has no fused kernels;
//   - weight_decay_params: matrices (nanoGPT's two param groups on both sides), fused and
//     not, with ZeRO (PyTorch's ZeroRedundancyOptimizer over the same two groups) and
//     without: every rank's per-step losses within the trainer's 1e-5;
//   - checkpoints: a fused run's (torch.optim's layout, the step count a float tensor)
//     resumes a run without fused and the reverse; with matrices it resumes bit for bit,
//     and a run of other param groups refuses it by name.
#include <ATen/ATen.h>
#include <torch/version.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/contract/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libddp/engine/checkpoint.h"
#include "libddp/engine/checkpoint_store.h"
#include "tests/common/run_captured.h"
#include "tests/trainer/trainer_harness.h"

namespace ddp {
namespace {

using testing::Event;
using testing::RankResult;

constexpr bool kHasFusedKernels = TORCH_VERSION_MAJOR >= 2;

// $OPT: the optimizer's fields; $STEPS: train.max_steps.
constexpr char kJob[] = R"(name: optimizer
model: {mlp: {hidden: [32, 16]}}
data: {synthetic: {samples: 400, features: 20, classes: 4}, seed: 3}
train:
  threads: 1
  epochs: 2
  batch_size: 8
  max_steps: $STEPS
  optimizer: {$OPT}
  seed: 7
$EXTRA)";

struct Knobs {
  int world = 2;
  std::string optimizer = "name: adamw, lr: 0.01, weight_decay: 0.1";
  int steps = 10;
  std::string extra;  // More top-level YAML.
  std::string dir;    // Empty: a fresh one.
};

std::string JobText(const Knobs& k) {
  return absl::StrReplaceAll(kJob, {{"$OPT", k.optimizer},
                                    {"$STEPS", absl::StrCat(k.steps)},
                                    {"$EXTRA", k.extra}});
}

struct TrainerRun {
  std::string dir;
  std::vector<std::map<int64_t, double>> losses;  // Per rank, [global_step] -> loss.
  std::string fingerprint;                       // Rank 0's parameters at the end.
  std::vector<RankResult> ranks;
};

TrainerRun RunTrainer(const Knobs& k, bool expect_ok = true) {
  TrainerRun run;
  run.dir = k.dir.empty() ? testing::MakeTempDir("optimizer") : k.dir;
  testing::WriteFile(run.dir + "/job.yaml", JobText(k));
  auto results = testing::RunTrainers(testing::LaunchOf(run.dir + "/job.yaml", k.world));
  EXPECT_TRUE(results.ok()) << results.status();
  if (!results.ok()) return run;
  run.ranks = *results;
  if (!expect_ok) return run;
  for (const RankResult& r : *results) {
    EXPECT_TRUE(r.exit.ok()) << "rank " << r.rank << " " << r.exit.ToString() << "\n"
                             << r.stderr_text;
    std::map<int64_t, double> losses;
    for (const Event& e : r.OfType("step")) {
      losses[static_cast<int64_t>(e.Number("global_step"))] = e.Number("loss");
    }
    run.losses.push_back(losses);
    auto done = r.OfType("done");
    EXPECT_EQ(done.size(), 1u) << r.stderr_text;
    if (done.empty()) continue;
    if (r.rank == 0) run.fingerprint = done[0].String("params_fingerprint");
  }
  return run;
}

// PyTorch's run of the same job: per rank, [global_step] -> loss.
std::vector<std::map<int64_t, double>> RunPyTorch(const Knobs& k, std::string* version) {
  const std::string dir = testing::MakeTempDir("optimizer-ref");
  testing::WriteFile(dir + "/job.yaml", JobText(k));
  SpawnOptions o;
  o.argv = {DDP_REFERENCE_PYTHON, testing::SourceDir() + "/scripts/pytorch_ddp_reference.py",
            "--spec", dir + "/job.yaml", "--world", absl::StrCat(k.world), "--out",
            dir + "/out.json"};
  auto run = testing::RunCaptured(o, absl::Minutes(4));
  EXPECT_TRUE(run.ok()) << run.status();
  std::vector<std::map<int64_t, double>> out;
  if (!run.ok()) return out;
  EXPECT_TRUE(run->exit.ok()) << run->err;
  auto json = testing::ParseJson(testing::ReadFile(dir + "/out.json"));
  EXPECT_TRUE(json.ok()) << json.status() << "\n" << run->err;
  testing::RemoveTree(dir);
  if (!json.ok()) return out;
  *version = json->struct_value().fields().at("torch").string_value();
  const auto& ranks = json->struct_value().fields().at("ranks").struct_value().fields();
  for (int r = 0; r < k.world; ++r) {
    std::map<int64_t, double> losses;
    const auto& rows = ranks.at(absl::StrCat(r)).struct_value().fields().at("losses").list_value();
    for (int i = 0; i < rows.values_size(); ++i) {
      losses[i] = rows.values(i).list_value().values(2).number_value();  // [epoch, step, loss]
    }
    out.push_back(losses);
  }
  return out;
}

// Every rank's losses against PyTorch's, within `tolerance`; the largest difference.
double ExpectMatches(const TrainerRun& run, const std::vector<std::map<int64_t, double>>& ref,
                     int steps, double tolerance, const std::string& torch_version) {
  double worst = 0;
  EXPECT_EQ(run.losses.size(), ref.size());
  for (size_t r = 0; r < run.losses.size() && r < ref.size(); ++r) {
    EXPECT_EQ(run.losses[r].size(), static_cast<size_t>(steps)) << "rank " << r;
    EXPECT_EQ(ref[r].size(), static_cast<size_t>(steps)) << "rank " << r;
    for (const auto& [step, loss] : run.losses[r]) {
      if (!ref[r].count(step)) continue;
      EXPECT_NEAR(loss, ref[r].at(step), tolerance)
          << "rank " << r << " step " << step << " against PyTorch " << torch_version;
      worst = std::max(worst, std::abs(loss - ref[r].at(step)));
    }
  }
  return worst;
}

// fused: true against torch.optim's fused=True under PyTorch's DDP, 2 ranks: AdamW with
// weight decay and SGD with Nesterov momentum.
TEST(TrainerOptimizerTest, FusedMatchesPyTorchsFusedOptimizersUnderDdp) {
  if (!kHasFusedKernels) GTEST_SKIP() << "LibTorch " << TORCH_VERSION << ": no fused kernels";
  for (const std::string& optimizer :
       {std::string("name: adamw, lr: 0.01, weight_decay: 0.1, fused: true"),
        std::string("name: sgd, lr: 0.05, momentum: 0.9, nesterov: true, weight_decay: 0.001, "
                    "fused: true")}) {
    SCOPED_TRACE(optimizer);
    Knobs k{.optimizer = optimizer, .steps = 12};
    std::string torch_version;
    const auto reference = RunPyTorch(k, &torch_version);
    const TrainerRun fused = RunTrainer(k);
    for (const RankResult& r : fused.ranks) {
      if (r.rank == 0) {
        EXPECT_THAT(r.stderr_text, ::testing::HasSubstr("through PyTorch's fused kernels"));
      }
    }
    const double worst = ExpectMatches(fused, reference, 12, 0.0, torch_version);  // Bit for bit.
    std::cerr << optimizer << ": largest loss difference from PyTorch " << torch_version
              << "'s fused=True: " << worst << "\n";
    testing::RemoveTree(fused.dir);
  }
}

TEST(TrainerOptimizerTest, FusedTrueIsRefusedByNameWithoutFusedKernels) {
  if (kHasFusedKernels) GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has fused kernels";
  const TrainerRun run =
      RunTrainer({.optimizer = "name: adamw, fused: true", .steps = 2}, /*expect_ok=*/false);
  ASSERT_EQ(run.ranks.size(), 2u);
  for (const RankResult& r : run.ranks) {
    EXPECT_EQ(r.exit.exit_code, kExitPermanent) << r.exit.ToString() << "\n" << r.stderr_text;
    EXPECT_THAT(r.stderr_text,
                ::testing::HasSubstr("train.optimizer.fused: true needs LibTorch 2.x"));
  }
  testing::RemoveTree(run.dir);
}

// weight_decay_params: matrices against nanoGPT's two param groups in torch.optim (fused
// where the LibTorch has the kernels, and not), with ZeRO against PyTorch's
// ZeroRedundancyOptimizer over the same groups, which must also equal the run without
// ZeRO bit for bit.
TEST(TrainerOptimizerTest, MatricesMatchPyTorchsTwoParamGroups) {
  std::vector<std::string> optimizers = {
      "name: adamw, lr: 0.01, weight_decay: 0.5, weight_decay_params: matrices, fused: false",
      "name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 0.05, weight_decay_params: matrices, "
      "fused: false"};
  if (kHasFusedKernels) {
    optimizers.push_back(
        "name: adamw, lr: 0.01, weight_decay: 0.5, weight_decay_params: matrices, fused: true");
  }
  for (const std::string& optimizer : optimizers) {
    for (const bool zero : {false, true}) {
      const std::string opt = absl::StrCat(optimizer, zero ? ", zero_redundancy: true" : "");
      SCOPED_TRACE(opt);
      Knobs k{.optimizer = opt, .steps = 12};
      std::string torch_version;
      const auto reference = RunPyTorch(k, &torch_version);
      const TrainerRun run = RunTrainer(k);
      const double worst = ExpectMatches(run, reference, 12, 1e-5, torch_version);
      std::cerr << opt << ": largest loss difference from PyTorch " << torch_version << ": "
                << worst << "\n";
      if (zero) {  // The same arithmetic as without ZeRO.
        k.optimizer = optimizer;
        const TrainerRun plain = RunTrainer(k);
        EXPECT_EQ(run.losses, plain.losses);
        EXPECT_EQ(run.fingerprint, plain.fingerprint);
        testing::RemoveTree(plain.dir);
      }
      testing::RemoveTree(run.dir);
    }
  }
}

// The decay matters: the same job with every parameter decaying goes elsewhere.
TEST(TrainerOptimizerTest, MatricesDecayOnlyTheMatrices) {
  const TrainerRun all = RunTrainer(
      {.optimizer = "name: adamw, lr: 0.01, weight_decay: 0.5, weight_decay_params: all",
       .steps = 6});
  const TrainerRun matrices = RunTrainer(
      {.optimizer = "name: adamw, lr: 0.01, weight_decay: 0.5, weight_decay_params: matrices",
       .steps = 6});
  ASSERT_EQ(all.losses.size(), 2u);
  ASSERT_EQ(matrices.losses.size(), 2u);
  EXPECT_EQ(all.losses[0].at(0), matrices.losses[0].at(0));  // Before the first update.
  EXPECT_NE(all.fingerprint, matrices.fingerprint);
  testing::RemoveTree(all.dir);
  testing::RemoveTree(matrices.dir);
}

// The newest checkpoint's optimizer entry in `ckpt`.
c10::IValue NewestOptimizerState(const std::string& ckpt, int64_t* global_step) {
  CheckpointStore store(CheckpointStore::Options{ckpt, "test", 2, -1});
  auto steps = store.Steps();
  EXPECT_TRUE(steps.ok() && !steps->empty()) << ckpt << ": " << steps.status();
  if (!steps.ok() || steps->empty()) return {};
  auto bytes = store.Read(steps->back());
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  if (!bytes.ok()) return {};
  auto state = DecodeCheckpoint(*bytes, store.PathFor(steps->back()));
  EXPECT_TRUE(state.ok()) << state.status();
  if (!state.ok()) return {};
  *global_step = state->position.global_step;
  return state->optimizer;
}

// A fused run's checkpoint is torch.optim's state_dict (every parameter's step count a
// float tensor, fused: true) and resumes a run without fused, whose own checkpoint
// resumes a fused run: each continues within 1e-5 of the uninterrupted run of its kind
// (fused and unfused kernels round differently), and a fused run resumed from a fused
// checkpoint, one written with ZeRO too, gives the uninterrupted fused run's losses bit
// for bit.
TEST(TrainerOptimizerTest, FusedCheckpointsResumeRunsWithoutFusedAndTheReverse) {
  if (!kHasFusedKernels) GTEST_SKIP() << "LibTorch " << TORCH_VERSION << ": no fused kernels";
  constexpr int kSteps = 30, kCut = 7;  // 25 steps an epoch: the cut is mid-epoch.
  const std::string checkpoint = "checkpoint: {dir: ckpt}\n";
  const std::string base = "name: adamw, lr: 0.01, weight_decay: 0.1, amsgrad: true";
  auto knobs = [&](bool fused, int steps, const std::string& dir, bool zero = false) {
    return Knobs{.optimizer = absl::StrCat(base, ", fused: ", fused ? "true" : "false",
                                           zero ? ", zero_redundancy: true" : ""),
                 .steps = steps, .extra = checkpoint, .dir = dir};
  };
  std::map<bool, TrainerRun> whole;
  for (const bool fused : {true, false}) whole[fused] = RunTrainer(knobs(fused, kSteps, ""));
  struct Case {
    bool first, second;
    bool zero = false;  // The first run with ZeRO: its shards' fused states consolidated.
  };
  for (const Case& c : {Case{true, false}, Case{false, true}, Case{true, true},
                        Case{true, true, true}}) {
    const bool first = c.first, second = c.second;
    SCOPED_TRACE(absl::StrCat(first ? "fused" : "not fused", c.zero ? " with ZeRO" : "",
                              ", then ", second ? "fused" : "not fused"));
    const TrainerRun a = RunTrainer(knobs(first, kCut, "", c.zero));
    int64_t global_step = -1;
    const c10::IValue saved = NewestOptimizerState(a.dir + "/ckpt", &global_step);
    EXPECT_EQ(global_step, kCut);
    ASSERT_TRUE(saved.isGenericDict());
    const auto group = saved.toGenericDict().at("param_groups").toList().get(0).toGenericDict();
    EXPECT_EQ(group.at("fused").toBool(), first);
    const auto state = saved.toGenericDict().at("state").toGenericDict();
    EXPECT_EQ(state.size(), 6u);  // 3 layers: 3 weights, 3 biases.
    for (const auto& entry : state) {
      const at::Tensor step = entry.value().toGenericDict().at("step").toTensor();
      EXPECT_EQ(step.scalar_type(), at::kFloat);
      EXPECT_EQ(step.item<double>(), static_cast<double>(kCut));
      EXPECT_EQ(entry.value().toGenericDict().size(), 4u);  // amsgrad: max_exp_avg_sq too.
    }
    const TrainerRun b = RunTrainer(knobs(second, kSteps, a.dir));
    ASSERT_EQ(b.losses.size(), 2u);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(b.losses[r].size(), static_cast<size_t>(kSteps - kCut)) << "rank " << r;
      for (const auto& [s, loss] : b.losses[r]) {
        EXPECT_GE(s, kCut);
        if (first == second) {
          EXPECT_EQ(loss, whole[second].losses[r].at(s)) << "rank " << r << " step " << s;
        } else {
          EXPECT_NEAR(loss, whole[second].losses[r].at(s), 1e-5) << "rank " << r << " step " << s;
        }
      }
    }
    if (first == second) {
      EXPECT_EQ(b.fingerprint, whole[second].fingerprint);
    }
    testing::RemoveTree(a.dir);
  }
  for (auto& [fused, run] : whole) testing::RemoveTree(run.dir);
}

// weight_decay_params: matrices resumes from its checkpoint bit for bit (two param groups
// in torch.optim's numbering), and a run of one group refuses that checkpoint by name.
TEST(TrainerOptimizerTest, MatricesCheckpointsResumeAndOtherGroupsRefuseThem) {
  constexpr int kSteps = 12, kCut = 5;
  const std::string checkpoint = "checkpoint: {dir: ckpt}\n";
  const std::string matrices =
      "name: adamw, lr: 0.01, weight_decay: 0.5, weight_decay_params: matrices";
  const TrainerRun whole =
      RunTrainer({.optimizer = matrices, .steps = kSteps, .extra = checkpoint});
  const TrainerRun a = RunTrainer({.optimizer = matrices, .steps = kCut, .extra = checkpoint});
  int64_t global_step = -1;
  const c10::IValue saved = NewestOptimizerState(a.dir + "/ckpt", &global_step);
  ASSERT_TRUE(saved.isGenericDict());
  const auto groups = saved.toGenericDict().at("param_groups").toList();
  ASSERT_EQ(groups.size(), 2u);
  // The MLP's parameters in order: w0 b0 w1 b1 w2 b2; the matrices first.
  EXPECT_EQ(groups.get(0).toGenericDict().at("params").toIntVector(),
            (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(groups.get(1).toGenericDict().at("params").toIntVector(),
            (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(groups.get(0).toGenericDict().at("weight_decay").toDouble(), 0.5);
  EXPECT_EQ(groups.get(1).toGenericDict().at("weight_decay").toDouble(), 0.0);
  const auto state = saved.toGenericDict().at("state").toGenericDict();
  EXPECT_EQ(state.at(1).toGenericDict().at("exp_avg").toTensor().sizes(),
            (std::vector<int64_t>{16, 32}));  // w1
  EXPECT_EQ(state.at(3).toGenericDict().at("exp_avg").toTensor().sizes(),
            (std::vector<int64_t>{32}));  // b0
  // A copy of the checkpoint for the run of one group.
  const std::string other = testing::MakeTempDir("optimizer-other");
  std::filesystem::copy(a.dir + "/ckpt", other + "/ckpt", std::filesystem::copy_options::recursive);
  const TrainerRun b =
      RunTrainer({.optimizer = matrices, .steps = kSteps, .extra = checkpoint, .dir = a.dir});
  ASSERT_EQ(b.losses.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(b.losses[r].size(), static_cast<size_t>(kSteps - kCut));
    for (const auto& [s, loss] : b.losses[r]) {
      EXPECT_EQ(loss, whole.losses[r].at(s)) << "rank " << r << " step " << s;
    }
  }
  EXPECT_EQ(b.fingerprint, whole.fingerprint);
  const TrainerRun c = RunTrainer({.optimizer = "name: adamw, lr: 0.01, weight_decay: 0.5",
                                   .steps = kSteps, .extra = checkpoint, .dir = other},
                                  /*expect_ok=*/false);
  for (const RankResult& r : c.ranks) {
    EXPECT_EQ(r.exit.exit_code, kExitPermanent) << r.exit.ToString() << "\n" << r.stderr_text;
    EXPECT_THAT(r.stderr_text, ::testing::HasSubstr(
                                   "the optimizer state has 2 param group(s) of [3, 3] "
                                   "parameters, this run's optimizer 1 of [6]"));
  }
  for (const std::string& dir : {whole.dir, a.dir, other}) testing::RemoveTree(dir);
}

}  // namespace
}  // namespace ddp
