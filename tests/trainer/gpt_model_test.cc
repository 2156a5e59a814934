// model.gpt and data.tokens against PyTorch's own objects, run live by the flavour's
// Python (tests/trainer/gpt_reference.py): nanoGPT's initial weights bit for bit, its
// logits, and DistributedSampler's windows of a token file; and every bad token file
// refused by name by real ddp-trainer processes, with the bad-spec exit code.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/serialize.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/contract/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libddp/engine/sampler.h"
#include "tests/common/status_matchers.h"
#include "tests/trainer/gpt_test_util.h"
#include "tests/trainer/trainer_harness.h"
#include "trainer/dataset.h"
#include "trainer/gpt.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

// A Python run that must succeed, its stderr shown when it does not.
#define ASSERT_OK_RUN(expr)                              \
  do {                                                   \
    const auto run_ = (expr);                            \
    ASSERT_TRUE(run_.ok()) << run_.status();             \
  } while (false)

const std::string& Reference() {
  static const std::string path = testing::SourceDir() + "/tests/trainer/gpt_reference.py";
  return path;
}

// A file torch.save wrote: a dict of tensors, strings and lists.
c10::impl::GenericDict LoadPt(const std::string& path) {
  const std::string bytes = testing::ReadFile(path);
  return torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toGenericDict();
}

std::vector<std::string> Strings(const c10::IValue& list) {
  std::vector<std::string> out;
  for (const c10::IValue& v : list.toListRef()) out.push_back(v.toStringRef());
  return out;
}

template <typename Named>
std::vector<std::string> NamesOf(const Named& named) {
  std::vector<std::string> out;
  for (const auto& [name, t] : named) out.push_back(name);
  return out;
}

GptSpec SmallGpt(bool tied) {
  GptSpec g;
  g.layers = 2;
  g.heads = 2;
  g.dim = 32;
  g.seq_len = 16;
  g.vocab = 256;
  g.tie_weights = tied;
  return g;
}

class GptInitTest : public ::testing::TestWithParam<bool> {};

// The draws of nanoGPT's construction, apply(_init_weights) and c_proj re-init, in
// order (decision 168): every parameter equals PyTorch's bit for bit, under the same
// names in the same order, and the generator is left where PyTorch leaves it.
TEST_P(GptInitTest, ParametersEqualNanoGptsBitForBitAndSoDoLogits) {
  const bool tied = GetParam();
  const std::string dir = testing::MakeTempDir("gpt-init");
  std::vector<std::string> args = {Reference(), "init", "--seed", "7", "--out", dir + "/init.pt"};
  if (!tied) args.push_back("--untied");
  ASSERT_OK_RUN(testing::RunPython(args));
  const c10::impl::GenericDict ref = LoadPt(dir + "/init.pt");
  testing::RemoveTree(dir);

  at::set_num_threads(1);
  at::manual_seed(7);
  std::unique_ptr<Model> model = BuildGpt(SmallGpt(tied));
  const at::Tensor next_draw = at::rand({8});

  const std::vector<NamedTensor> params = model->Parameters();
  EXPECT_EQ(NamesOf(params), Strings(ref.at("names")));
  EXPECT_EQ(NamesOf(model->StateDict()), Strings(ref.at("state_names")));
  EXPECT_EQ(params.size(), tied ? 28u : 29u);
  const c10::impl::GenericDict theirs = ref.at("params").toGenericDict();
  for (const auto& [name, p] : params) {
    ASSERT_TRUE(theirs.contains(name)) << name;
    EXPECT_TRUE(at::equal(p, theirs.at(name).toTensor())) << name << " differs from nanoGPT's";
    EXPECT_TRUE(p.requires_grad()) << name;
  }
  EXPECT_TRUE(at::equal(next_draw, ref.at("after").toTensor()))
      << "the model drew another number of values than PyTorch's modules";
  if (tied) {
    // lm_head.weight in the state dict is the token embedding itself.
    const std::vector<NamedTensor> state = model->StateDict();
    EXPECT_TRUE(state.back().second.is_same(state.front().second));
  }

  at::NoGradGuard no_grad;
  model->SetTraining(false);
  const at::Tensor logits = model->Forward(ref.at("input").toTensor());
  const at::Tensor expected = ref.at("logits").toTensor();
  ASSERT_EQ(logits.sizes(), expected.sizes());
  const double diff = (logits - expected).abs().max().item<double>();
  std::cout << "logits against nanoGPT's (" << ref.at("torch").toStringRef()
            << (tied ? ", tied" : ", untied") << "): max |diff| " << diff << "\n";
  EXPECT_LE(diff, 1e-6);
}

INSTANTIATE_TEST_SUITE_P(TiedAndUntied, GptInitTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "tied" : "untied"; });

DataSpec TokenData(const std::string& path, TokenDtype dtype = TokenDtype::kUint16) {
  DataSpec d;
  d.kind = DataSpec::Kind::kTokens;
  d.tokens.path = path;
  d.tokens.dtype = dtype;
  return d;
}

ModelSpec GptModel(int64_t seq_len, int64_t vocab = 256) {
  ModelSpec m;
  m.kind = ModelSpec::Kind::kGpt;
  m.gpt = SmallGpt(true);
  m.gpt.seq_len = seq_len;
  m.gpt.vocab = vocab;
  return m;
}

// Each rank's windows, epoch by epoch, are those PyTorch's DistributedSampler gives over
// a Dataset of the same windows (shuffled, padded to a multiple of the world), and the
// batches hold the same tokens as DataLoader's; a uint32 file of the same ids too.
TEST(GptDataTest, EachRanksWindowsAndBatchesAreDistributedSamplersOverTheSameWindows) {
  const std::string dir = testing::MakeTempDir("gpt-windows");
  {
    const absl::Status made = testing::MakeByteTokens(dir);
    ASSERT_TRUE(made.ok()) << made;
  }
  ASSERT_OK_RUN(testing::RunPython({testing::SourceDir() + "/scripts/make_tokens.py", "--out",
                                    dir + "/wide", "--dtype", "uint32", testing::kGplText}));
  constexpr int64_t kSeqLen = 128, kBatch = 4, kSeed = 5;
  ASSERT_OK_RUN(testing::RunPython({Reference(), "windows", "--tokens", dir + "/train.bin",
                                    "--seq-len", absl::StrCat(kSeqLen), "--batch",
                                    absl::StrCat(kBatch), "--seed", absl::StrCat(kSeed),
                                    "--worlds", "2", "3", "--epochs", "2", "--out",
                                    dir + "/windows.pt"}));
  const c10::impl::GenericDict ref = LoadPt(dir + "/windows.pt");
  DDP_ASSERT_OK_AND_ASSIGN(TrainValData data,
                           LoadData(TokenData(dir + "/train.bin"), LossKind::kCrossEntropy,
                                    GptModel(kSeqLen)));
  DDP_ASSERT_OK_AND_ASSIGN(
      TrainValData wide,
      LoadData(TokenData(dir + "/wide/train.bin", TokenDtype::kUint32), LossKind::kCrossEntropy,
               GptModel(kSeqLen)));
  testing::RemoveTree(dir);
  // 31,635 tokens: (31635 - 1) / 128 windows of 129.
  EXPECT_EQ(data.train.size(), 247);
  EXPECT_EQ(ref.at("windows").toInt(), 247);
  EXPECT_EQ(data.val.size(), 0) << "no data.validation.tokens given";
  BatchAssembler batches(data.train, kBatch);
  BatchAssembler wide_batches(wide.train, kBatch);
  for (int64_t world : {2, 3}) {
    for (int64_t rank = 0; rank < world; ++rank) {
      for (int64_t epoch = 0; epoch < 2; ++epoch) {
        const std::string key = absl::StrCat("w", world, "r", rank, "e", epoch);
        SCOPED_TRACE(key);
        SamplerOptions o{world, rank, /*shuffle=*/true, kSeed, /*drop_last=*/false};
        const std::vector<int64_t> order = DistributedSamplerIndices(data.train.size(), o, epoch);
        const at::Tensor expected = ref.at(key + "_indices").toTensor();
        ASSERT_EQ(static_cast<int64_t>(order.size()), expected.numel());
        EXPECT_TRUE(at::equal(at::tensor(order), expected));
        std::vector<at::Tensor> xs, ys;
        for (size_t b = 0; b < order.size(); b += kBatch) {
          const int64_t n = std::min<int64_t>(kBatch, static_cast<int64_t>(order.size() - b));
          auto [x, y] = batches.Gather(order.data() + b, n);
          ASSERT_EQ(x.sizes(), (std::vector<int64_t>{n, kSeqLen}));
          ASSERT_EQ(x.scalar_type(), at::kLong);
          xs.push_back(x.clone());
          ys.push_back(y.clone());
          auto [wx, wy] = wide_batches.Gather(order.data() + b, n);
          EXPECT_TRUE(at::equal(wx, xs.back()) && at::equal(wy, ys.back()));
        }
        EXPECT_TRUE(at::equal(at::cat(xs), ref.at(key + "_x").toTensor()));
        EXPECT_TRUE(at::equal(at::cat(ys), ref.at(key + "_y").toTensor()));
      }
    }
  }
}

// A token file the trainer cannot use is refused at start, naming the field, the file
// and what is wrong, with exit code 2 (permanent: no retry can help).
class BadTokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("gpt-bad"); }
  void TearDown() override { testing::RemoveTree(dir_); }

  static std::string Ids(const std::vector<uint16_t>& ids) {
    return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 2);
  }
  // One rank on `train`, with `val` as validation file when not empty; the error event.
  std::string Refusal(const std::string& train, const std::string& val = "") {
    std::string yaml = absl::StrCat(
        "name: bad-tokens\nmodel: {gpt: {layers: 1, heads: 1, dim: 8, seq_len: 16, vocab: 256}}\n"
        "data:\n  tokens: {path: ",
        train, "}\n");
    if (!val.empty()) absl::StrAppend(&yaml, "  validation: {tokens: {path: ", val, "}}\n");
    absl::StrAppend(&yaml, "train: {batch_size: 2, threads: 1}\n");
    testing::WriteFile(dir_ + "/job.yaml", yaml);
    auto results = testing::RunTrainers(testing::LaunchOf(dir_ + "/job.yaml", 1));
    EXPECT_TRUE(results.ok()) << results.status();
    if (!results.ok()) return "";
    const testing::RankResult& r = (*results)[0];
    EXPECT_EQ(r.exit.exit_code, kExitPermanent) << r.exit.ToString() << "\n" << r.stderr_text;
    auto errors = r.OfType("error");
    EXPECT_EQ(errors.size(), 1u) << r.stderr_text;
    return errors.empty() ? "" : errors[0].String("message");
  }
  std::string dir_;
};

TEST_F(BadTokenFileTest, AnOddSizeForUint16IsRefusedNamingTheFile) {
  testing::WriteFile(dir_ + "/odd.bin", Ids(std::vector<uint16_t>(40, 7)) + "x");
  EXPECT_THAT(Refusal("odd.bin"),
              HasSubstr("data.tokens.path: 'odd.bin' has 81 bytes, not a whole number of uint16 "
                        "token ids (2 bytes each)"));
}

TEST_F(BadTokenFileTest, AnIdPastTheVocabularyIsRefusedSayingWhichAndWhere) {
  std::vector<uint16_t> ids(40, 65);
  ids[21] = 300;
  ids[30] = 999;  // Only the first is named.
  testing::WriteFile(dir_ + "/big.bin", Ids(ids));
  EXPECT_THAT(Refusal("big.bin"),
              HasSubstr("data.tokens.path: 'big.bin': token 21 (byte 42) is id 300, not below "
                        "model.gpt.vocab 256"));
}

TEST_F(BadTokenFileTest, FewerTokensThanOneWindowAreRefused) {
  testing::WriteFile(dir_ + "/short.bin", Ids(std::vector<uint16_t>(16, 1)));
  EXPECT_THAT(Refusal("short.bin"),
              HasSubstr("data.tokens.path: 'short.bin' holds 16 tokens, fewer than one window "
                        "of model.gpt.seq_len + 1 = 17"));
}

TEST_F(BadTokenFileTest, AMissingFileIsRefusedNamingIt) {
  EXPECT_THAT(Refusal("missing.bin"),
              HasSubstr("data.tokens.path: 'missing.bin': cannot open it (No such file"));
}

TEST_F(BadTokenFileTest, TheValidationFileIsCheckedAndNamedToo) {
  testing::WriteFile(dir_ + "/train.bin", Ids(std::vector<uint16_t>(40, 1)));
  std::vector<uint16_t> val(40, 2);
  val[39] = 256;
  testing::WriteFile(dir_ + "/val.bin", Ids(val));
  EXPECT_THAT(Refusal("train.bin", "val.bin"),
              HasSubstr("data.validation.tokens.path: 'val.bin': token 39 (byte 78) is id 256"));
  EXPECT_THAT(Refusal("train.bin", "gone.bin"),
              HasSubstr("data.validation.tokens.path: 'gone.bin': cannot open it"));
}

}  // namespace
}  // namespace ddp
