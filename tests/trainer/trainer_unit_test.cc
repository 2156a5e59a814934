// In-process tests of the trainer's building blocks against PyTorch's behaviour.
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <sstream>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/trainer/trainer_harness.h"
#include "libddp/engine/checkpoint.h"
#include "libddp/engine/optimizer.h"
#include "trainer/dataset.h"
#include "libddp/engine/reducer.h"
#include "libddp/engine/sampler.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(DistributedSamplerTest, MatchesPyTorchOverTheFixtureGrid) {
  std::ifstream in(testing::SourceDir() + "/tests/fixtures/sampler_grid.txt");
  ASSERT_TRUE(in) << "run scripts/gen_fixtures.py";
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> halves = absl::StrSplit(line, " : ");
    ASSERT_EQ(halves.size(), 2u) << line;
    std::vector<std::string> p = absl::StrSplit(halves[0], ' ');
    ASSERT_EQ(p.size(), 7u);
    int64_t n, world, rank, seed, epoch, shuffle, drop_last;
    ASSERT_TRUE(absl::SimpleAtoi(p[0], &n) && absl::SimpleAtoi(p[1], &world) &&
                absl::SimpleAtoi(p[2], &rank) && absl::SimpleAtoi(p[3], &seed) &&
                absl::SimpleAtoi(p[4], &epoch) && absl::SimpleAtoi(p[5], &shuffle) &&
                absl::SimpleAtoi(p[6], &drop_last));
    std::vector<int64_t> expected;
    for (absl::string_view tok : absl::StrSplit(halves[1], ' ', absl::SkipEmpty())) {
      int64_t v;
      ASSERT_TRUE(absl::SimpleAtoi(tok, &v));
      expected.push_back(v);
    }
    SamplerOptions o{world, rank, shuffle != 0, seed, drop_last != 0};
    EXPECT_EQ(DistributedSamplerIndices(n, o, epoch), expected) << "case: " << halves[0];
    EXPECT_EQ(DistributedSamplerLength(n, o), static_cast<int64_t>(expected.size()));
    ++cases;
  }
  EXPECT_GT(cases, 1000);
}

TEST(DistributedSamplerTest, SeedTutorialCaseGives28BatchesPerRank) {
  // 455 training rows, batch 8, 2 ranks, drop_last: 228 samples -> 28 batches.
  for (int64_t rank = 0; rank < 2; ++rank) {
    SamplerOptions o{2, rank, true, 0, false};
    auto idx = DistributedSamplerIndices(455, o, 0);
    EXPECT_EQ(idx.size(), 228u);
    EXPECT_EQ(NumBatches(static_cast<int64_t>(idx.size()), 8, /*drop_last=*/true), 28);
  }
}

TEST(DistributedSamplerTest, EpochsReshuffleAndRanksPartitionTheData) {
  SamplerOptions r0{2, 0, true, 5, false}, r1{2, 1, true, 5, false};
  auto a = DistributedSamplerIndices(10, r0, 0), b = DistributedSamplerIndices(10, r1, 0);
  std::vector<int64_t> all(a);
  all.insert(all.end(), b.begin(), b.end());
  std::sort(all.begin(), all.end());
  EXPECT_THAT(all, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));
  EXPECT_NE(DistributedSamplerIndices(10, r0, 1), a);
}

// Decision 191: after `consumed` positions of an epoch's order at one world, the rest is
// sharded over another, and the epoch visits every sample once.
TEST(DistributedSamplerTest, TheRestOfAnEpochIsShardedOverANewWorldSize) {
  const int64_t n = 480;
  // 5 steps of batch 8 at 3 ranks consumed a prefix of the order: exactly positions 0..119.
  std::vector<int64_t> seen;
  for (int64_t rank = 0; rank < 3; ++rank) {
    auto idx = DistributedSamplerIndices(n, SamplerOptions{3, rank, true, 7, false}, 2);
    seen.insert(seen.end(), idx.begin(), idx.begin() + 5 * 8);
  }
  EXPECT_EQ(EpochSamplesConsumed(n, 0, 5, 1, 8, 3), 120);
  std::vector<int64_t> order = DistributedSamplerIndices(n, SamplerOptions{1, 0, true, 7, false}, 2);
  std::vector<int64_t> prefix(order.begin(), order.begin() + 120);
  std::sort(seen.begin(), seen.end());
  std::sort(prefix.begin(), prefix.end());
  EXPECT_EQ(seen, prefix);
  // The other 360 over 2 ranks: order[120:] shard by shard, nothing of the prefix again.
  std::vector<int64_t> rest;
  for (int64_t rank = 0; rank < 2; ++rank) {
    auto idx = DistributedSamplerIndices(n, SamplerOptions{2, rank, true, 7, false}, 2, 120);
    ASSERT_EQ(idx.size(), 180u);
    for (size_t j = 0; j < idx.size(); ++j) {
      EXPECT_EQ(idx[j], order[120 + rank + 2 * j]) << "rank " << rank << " sample " << j;
    }
    rest.insert(rest.end(), idx.begin(), idx.end());
  }
  std::vector<int64_t> all = prefix;
  all.insert(all.end(), rest.begin(), rest.end());
  std::sort(all.begin(), all.end());
  std::vector<int64_t> every(n);
  std::iota(every.begin(), every.end(), 0);
  EXPECT_EQ(all, every) << "each sample of the epoch once";
  // A rest that does not divide is padded from its own start, as the sampler pads.
  auto r0 = DistributedSamplerIndices(n, SamplerOptions{3, 0, true, 7, false}, 2, 478);
  auto r2 = DistributedSamplerIndices(n, SamplerOptions{3, 2, true, 7, false}, 2, 478);
  EXPECT_EQ(r0, (std::vector<int64_t>{order[478]}));
  EXPECT_EQ(r2, (std::vector<int64_t>{order[478]}));
  // Offset 0 is the sampler itself; an epoch consumed whole leaves nothing.
  EXPECT_EQ(DistributedSamplerIndices(n, SamplerOptions{2, 1, true, 7, false}, 2, 0),
            DistributedSamplerIndices(n, SamplerOptions{2, 1, true, 7, false}, 2));
  EXPECT_TRUE(DistributedSamplerIndices(n, SamplerOptions{2, 1, true, 7, false}, 2, n).empty());
  EXPECT_EQ(EpochSamplesConsumed(n, 400, 9, 2, 8, 3), n) << "at most the epoch";
}

TEST(BucketAssignmentTest, ReverseOrderFirstBucketSmallThenCap) {
  // Parameters 0..4 of 600, 600, 600, 600, 600 bytes; first cap 1000, then 1500.
  auto b = AssignBuckets({600, 600, 600, 600, 600}, 1000, 1500);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_THAT(b[0].params, ElementsAre(4, 3));     // Closes at 1200 >= 1000.
  EXPECT_THAT(b[1].params, ElementsAre(2, 1, 0));  // 1200 < 1500 stays open; 1800 closes.
  EXPECT_EQ(b[0].bytes, 1200);
  auto one = AssignBuckets({600, 600}, 1 << 20, 25 << 20);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_THAT(one[0].params, ElementsAre(1, 0));
}

DataSpec CancerSpec() {
  DataSpec d;
  d.kind = DataSpec::Kind::kCsv;
  d.csv.path = testing::SourceDir() + "/data/breast_cancer.csv";
  d.csv.skip_rows = 1;
  d.csv.standardize = true;
  d.validation.fraction = 0.2;
  return d;
}

TEST(DatasetTest, SplitsBreastCancerAsDesignSays) {
  DDP_ASSERT_OK_AND_ASSIGN(TrainValData data, LoadData(CancerSpec(), LossKind::kCrossEntropy));
  EXPECT_EQ(data.train.size(), 455);
  EXPECT_EQ(data.val.size(), 114);
  EXPECT_EQ(data.num_classes, 2);
  EXPECT_THAT(data.sample_shape, ElementsAre(30));
  // z-scored with the training split's population statistics.
  EXPECT_LT(data.train.features.mean(0).abs().max().item<float>(), 1e-5);
  EXPECT_NEAR(data.train.features.std(0, /*unbiased=*/false).mean().item<float>(), 1.0, 1e-5);
  EXPECT_EQ(data.train.targets.scalar_type(), at::kLong);
}

TEST(DatasetTest, ReadsGzippedIdx) {
  DataSpec d;
  d.kind = DataSpec::Kind::kIdx;
  d.idx.images = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz";
  d.idx.labels = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz";
  DDP_ASSERT_OK_AND_ASSIGN(TrainValData data, LoadData(d, LossKind::kCrossEntropy));
  EXPECT_EQ(data.train.size(), 10000);
  EXPECT_THAT(data.sample_shape, ElementsAre(1, 28, 28));
  EXPECT_EQ(data.num_classes, 10);
  EXPECT_LE(data.train.features.max().item<float>(), 1.0f);
}

TEST(DatasetTest, ErrorsNameTheFileAndLine) {
  std::string dir = testing::MakeTempDir("csv");
  testing::WriteFile(dir + "/bad.csv", "a,b,label\n1,2,0\n3,x,1\n");
  DataSpec d;
  d.csv.path = dir + "/bad.csv";
  d.csv.skip_rows = 1;
  EXPECT_THAT(LoadData(d, LossKind::kCrossEntropy),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bad.csv:3: column 2 is not a number: 'x'")));
  d.csv.path = dir + "/missing.csv";
  EXPECT_THAT(LoadData(d, LossKind::kCrossEntropy),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing.csv")));
  testing::WriteFile(dir + "/labels.csv", "1,2,0.5\n3,4,1\n");
  d.csv.path = dir + "/labels.csv";
  d.csv.skip_rows = 0;
  EXPECT_THAT(LoadData(d, LossKind::kCrossEntropy),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("integer class ids")));
}

TEST(DatasetTest, NonFiniteValuesAreRejectedWithTheirLine) {
  std::string dir = testing::MakeTempDir("csv-nan");
  testing::WriteFile(dir + "/nan.csv", "1,2,0\n3,nan,1\n");
  DataSpec d;
  d.csv.path = dir + "/nan.csv";
  EXPECT_THAT(LoadData(d, LossKind::kCrossEntropy),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("nan.csv:2: column 2 is 'nan': values must be finite")));
  testing::WriteFile(dir + "/inf.csv", "1,-inf,0\n");
  d.csv.path = dir + "/inf.csv";
  EXPECT_THAT(LoadData(d, LossKind::kCrossEntropy),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("inf.csv:1: column 2")));
}

TEST(BatchAssemblerTest, GathersRowsIntoReusedBuffers) {
  Dataset d{at::arange(20, at::kFloat).reshape({10, 2}), at::arange(10, at::kLong)};
  BatchAssembler batches(d, 4);
  std::vector<int64_t> idx = {7, 2, 9};
  auto [x, y] = batches.Gather(idx.data(), 3);
  EXPECT_TRUE(at::equal(y, at::tensor({7, 2, 9}, at::kLong)));
  EXPECT_TRUE(at::equal(x[0], at::tensor({14.f, 15.f})));
  const void* storage = x.data_ptr();
  auto [x2, y2] = batches.Gather(idx.data(), 2);
  EXPECT_EQ(x2.data_ptr(), storage);  // Same buffer, no new allocation.
  EXPECT_EQ(x2.size(0), 2);
}

TrainingState SampleState() {
  TrainingState s;
  s.identity = {"cancer", "cancer-abc12", 3, "node-b"};
  s.position = {2, 7, 63};
  s.sampler = {2, 8, 1, 5, true, 455, 0};
  s.order = {40, 2};
  s.epoch_loss_sum = 1.25;
  s.epoch_steps = 14;
  s.model = {{"1.weight", at::arange(6, at::kFloat).reshape({2, 3})},
             {"1.bias", at::ones({2})}};
  s.optimizer = c10::IValue(std::string("opaque optimizer state"));
  s.rng_state = at::arange(4, at::kByte);
  return s;
}

TEST(CheckpointSchemaTest, EveryFieldOfTheTrainingStateSurvivesTheBytes) {
  const TrainingState in = SampleState();
  DDP_ASSERT_OK_AND_ASSIGN(TrainingState out, DecodeCheckpoint(EncodeCheckpoint(in), "x.pt"));
  EXPECT_EQ(out.identity.job, "cancer");
  EXPECT_EQ(out.identity.job_id, "cancer-abc12");
  EXPECT_EQ(out.identity.attempt, 3);
  EXPECT_EQ(out.identity.node, "node-b");
  EXPECT_EQ(out.position.epoch, 2);
  EXPECT_EQ(out.position.step, 7);
  EXPECT_EQ(out.position.global_step, 63);
  EXPECT_TRUE(SameDataOrder(out.sampler, in.sampler) && SameDataOrder(in.sampler, out.sampler));
  EXPECT_EQ(out.sampler.train_samples, 455);
  EXPECT_EQ(out.epoch_loss_sum, 1.25);
  EXPECT_EQ(out.epoch_steps, 14);
  EXPECT_EQ(out.order.offset, 40);
  EXPECT_EQ(out.order.first_step, 2);
  // 40 + (7 - 2) steps of the sampler's batches over its world.
  EXPECT_EQ(out.epoch_samples_done,
            40 + 5 * in.sampler.grad_accum_steps * in.sampler.batch_size * in.sampler.world_size);
  ASSERT_EQ(out.model.size(), 2u);
  EXPECT_EQ(out.model[0].first, "1.weight");
  EXPECT_TRUE(out.model[0].second.equal(in.model[0].second));
  EXPECT_EQ(out.optimizer.toStringRef(), "opaque optimizer state");
  EXPECT_TRUE(out.rng_state.equal(in.rng_state));
}

TEST(CheckpointSchemaTest, AnotherModelIsRefusedAndAnotherDataOrderIsNoticed) {
  TrainingState in = SampleState();
  DDP_ASSERT_OK_AND_ASSIGN(TrainingState out, DecodeCheckpoint(EncodeCheckpoint(in), "x.pt"));
  at::Tensor w = at::zeros({2, 3}), b = at::zeros({2});
  ASSERT_TRUE(RestoreModel(out, {{"1.weight", w}, {"1.bias", b}}, "x.pt").ok());
  EXPECT_TRUE(w.equal(in.model[0].second));
  EXPECT_THAT(RestoreModel(out, {{"1.weight", at::zeros({3, 3})}, {"1.bias", b}}, "x.pt"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor '1.weight' is missing or has another shape")));
  SamplerState other = in.sampler;
  other.world_size = 4;
  EXPECT_FALSE(SameDataOrder(in.sampler, other));
  SamplerState unknown = in.sampler;
  unknown.train_samples = -1;  // A format 1 file.
  EXPECT_TRUE(SameDataOrder(unknown, in.sampler));
  // Another world, batch size or accumulation keeps the epoch's permutation; another
  // seed or training set does not.
  other.batch_size = 3;
  other.grad_accum_steps = 5;
  EXPECT_TRUE(SamePermutation(in.sampler, other));
  other.seed = in.sampler.seed + 1;
  EXPECT_FALSE(SamePermutation(in.sampler, other));
  SamplerState fewer = in.sampler;
  fewer.train_samples = 400;
  EXPECT_FALSE(SamePermutation(in.sampler, fewer));
  // An order that began after the position is no checkpoint of ours.
  TrainingState bad = SampleState();
  bad.order.first_step = bad.position.step + 1;
  EXPECT_THAT(DecodeCheckpoint(EncodeCheckpoint(bad), "x.pt"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'epoch_order_offset'")));
}

// Steps an optimizer of `spec` on the loop over parameters and one on the multi-tensor
// path over the same parameters and gradients for 5 steps (parameter 2's first gradient
// two steps late) and expects the same values after every step and the same state (what
// a checkpoint keeps) bit for bit; `is_kind` checks what the multi-tensor one is.
// Returns the loop's state dict's "state".
c10::impl::GenericDict ExpectMultiTensorEqualsLoop(
    const OptimizerSpec& spec, const std::function<bool(torch::optim::Optimizer*)>& is_kind) {
  auto make_params = [] {
    std::vector<at::Tensor> ps;
    for (int i = 0; i < 3; ++i) {
      ps.push_back(at::linspace(-1, 1, 6 + i).sin().mul(i + 1).set_requires_grad(true));
    }
    return ps;
  };
  std::vector<at::Tensor> loop_params = make_params(), foreach_params = make_params();
  auto loop = MakeOptimizer(spec, loop_params, /*multi_tensor=*/false);
  auto foreach = MakeOptimizer(spec, foreach_params, /*multi_tensor=*/true);
  EXPECT_TRUE(is_kind(foreach.get()));
  const at::Tensor first = loop_params[0].detach().clone();
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < loop_params.size(); ++i) {
      if (i == 2 && step < 2) continue;  // Parameter 2's state starts late.
      const at::Tensor g = at::linspace(0.3, -0.7, loop_params[i].numel()).mul(step + 1).cos();
      loop_params[i].mutable_grad() = g.clone();
      foreach_params[i].mutable_grad() = g.clone();
    }
    loop->step();
    foreach->step();
    for (size_t i = 0; i < loop_params.size(); ++i) {
      EXPECT_TRUE(at::equal(loop_params[i], foreach_params[i])) << "step " << step << " param " << i;
    }
  }
  EXPECT_FALSE(at::equal(first, loop_params[0])) << "the parameters did not move";
  const auto sa = OptimizerStateDict(spec, *loop).toGenericDict().at("state")
                      .toGenericDict();
  const auto sb = OptimizerStateDict(spec, *foreach).toGenericDict().at("state")
                      .toGenericDict();
  EXPECT_EQ(sa.size(), sb.size());
  for (const auto& entry : sa) {
    const auto other = sb.at(entry.key()).toGenericDict();
    for (const auto& field : entry.value().toGenericDict()) {
      EXPECT_TRUE(at::equal(field.value().toTensor(), other.at(field.key()).toTensor()))
          << field.key().toStringRef();
    }
  }
  return sa;
}

// SGD's multi-tensor update (PyTorch's default on a GPU) gives the loop over
// parameters' values bit for bit: weight decay, momentum, Nesterov, a parameter whose
// first gradient comes late, and the momentum buffers a checkpoint keeps.
TEST(MultiTensorSgdTest, EqualsTheLoopOverParametersBitForBit) {
  for (const auto& [momentum, nesterov, weight_decay] :
       std::vector<std::tuple<double, bool, double>>{
           {0.9, false, 0.0}, {0.9, true, 1e-4}, {0.0, false, 0.01}, {0.5, false, 0.0}}) {
    SCOPED_TRACE(::testing::Message() << "momentum " << momentum << " nesterov " << nesterov
                                      << " weight_decay " << weight_decay);
    OptimizerSpec spec;
    spec.kind = OptimizerKind::kSgd;
    spec.lr = 0.1;
    spec.momentum = momentum;
    spec.nesterov = nesterov;
    spec.weight_decay = weight_decay;
    ExpectMultiTensorEqualsLoop(
        spec, [](torch::optim::Optimizer* o) { return dynamic_cast<torch::optim::SGD*>(o); });
  }
}

// Adam and AdamW (decision 165): the multi-tensor path gives the loop's values bit for
// bit (amsgrad, both weight decays, a late first gradient), and both keep LibTorch's
// state, with each parameter's own step count.
TEST(MultiTensorAdamTest, EqualsTheLoopOverParametersBitForBit) {
  for (const auto& [kind, amsgrad, weight_decay] :
       std::vector<std::tuple<OptimizerKind, bool, double>>{
           {OptimizerKind::kAdam, false, 0.0}, {OptimizerKind::kAdam, true, 1e-2},
           {OptimizerKind::kAdamW, false, 1e-2}, {OptimizerKind::kAdamW, true, 0.0}}) {
    SCOPED_TRACE(::testing::Message() << "adamw " << (kind == OptimizerKind::kAdamW)
                                      << " amsgrad " << amsgrad << " weight_decay "
                                      << weight_decay);
    OptimizerSpec spec;
    spec.kind = kind;
    spec.lr = 0.01;
    spec.amsgrad = amsgrad;
    spec.weight_decay = weight_decay;
    const bool adamw = kind == OptimizerKind::kAdamW;
    const auto state = ExpectMultiTensorEqualsLoop(spec, [adamw](torch::optim::Optimizer* o) {
      return adamw ? dynamic_cast<torch::optim::AdamW*>(o) != nullptr
                   : dynamic_cast<torch::optim::Adam*>(o) != nullptr;
    });
    ASSERT_EQ(state.size(), 3u);
    for (const auto& entry : state) {  // Parameter 2 took 3 steps, the others 5.
      EXPECT_EQ(entry.value().toGenericDict().at("step").toTensor().item<double>(),
                entry.key().toInt() == 2 ? 3.0 : 5.0);
    }
  }
}

}  // namespace
}  // namespace ddp
