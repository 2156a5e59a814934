// libddp's communication hooks against PyTorch's: comm_hook_program (libddp's public API
// only) runs as real ranks with fp16_compress_hook, bf16_compress_hook and powerSGD_hook
// registered, and must reproduce, step for step over 2 and 3 ranks, the losses PyTorch
// DDP gives with the same hooks (comm_hook_reference.py, run live here by the Python of
// the LibTorch flavour under test: Debian's PyTorch 1.13 in build/, PyPI's 2.x in
// build-torch2/) and all-reduce the same bytes per step (the tensors PyTorch's hook
// passes to torch.distributed.all_reduce). PowerSGD's state goes through a checkpoint
// as PyTorch's pickled PowerSGDState does. Misuse fails with an error naming the fix.
#include <torch/nn/modules/linear.h>
#include <torch/version.h>
#include <unistd.h>

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/contract/exit_codes.h"
#include "common/process.h"
#include "ddp/ddp.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/ports.h"
#include "tests/common/test_util.h"
#include "tests/trainer/trainer_harness.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;
using testing::RankResult;

constexpr double kLossTolerance = 1e-5;  // As library_parity_test.

struct Config {
  const char* name;
  const char* json;                // The reference's config.
  std::vector<std::string> flags;  // comm_hook_program's.
};

const std::vector<Config>& Configs() {
  static const std::vector<Config> configs = {
      {"none", R"({"hook": "none"})", {"--hook", "none"}},
      {"fp16", R"({"hook": "fp16"})", {"--hook", "fp16"}},
      {"bf16", R"({"hook": "bf16"})", {"--hook", "bf16"}},
      // Rank 1 after 2 plain iterations, error feedback and warm start (Gram-Schmidt).
      {"powersgd",
       R"({"hook": "powersgd", "rank": 1, "start": 2, "error_feedback": 1, "warm_start": 1,
           "batch": 0})",
       {"--hook", "powersgd", "--rank", "1", "--start", "2", "--error-feedback", "1",
        "--warm-start", "1", "--batch", "0"}},
      // Rank 3 (QR), fresh random Qs every iteration, no error feedback, batched shapes.
      {"powersgd_r3",
       R"({"hook": "powersgd", "rank": 3, "start": 3, "error_feedback": 0, "warm_start": 0,
           "batch": 1})",
       {"--hook", "powersgd", "--rank", "3", "--start", "3", "--error-feedback", "0",
        "--warm-start", "0", "--batch", "1"}},
  };
  return configs;
}

struct RankRun {
  std::vector<double> losses;
  std::vector<double> bytes;
};

std::vector<double> Numbers(const google::protobuf::Value& list) {
  std::vector<double> out;
  for (const auto& v : list.list_value().values()) out.push_back(v.number_value());
  return out;
}

RankRun ParseRun(const google::protobuf::Value& v) {
  const auto& f = v.struct_value().fields();
  return {Numbers(f.at("losses")), Numbers(f.at("bytes"))};
}

// Where the runs that stop and resume keep their checkpoints: PyTorch's under
// StateDir() + "/ref", libddp's under StateDir() + "/ckpt.world<W>".
const std::string& StateDir() {
  static const std::string dir = testing::MakeTempDir("libddp-hook-state");
  return dir;
}

// PowerSGD (Configs()[3]) stopped after epoch 3, and resumed from its checkpoints.
constexpr int64_t kStopAfter = 3;
std::string StopConfigJson() {
  return absl::StrCat(R"({"hook": "powersgd", "rank": 1, "start": 2, "error_feedback": 1,)",
                      R"( "warm_start": 1, "batch": 0, "stop_after": )", kStopAfter,
                      R"(, "state": ")", StateDir(), R"(/ref"})");
}
std::string ResumeConfigJson() {
  return absl::StrCat(R"({"hook": "powersgd", "rank": 1, "start": 2, "error_feedback": 1,)",
                      R"( "warm_start": 1, "batch": 0, "resume": ")", StateDir(), R"(/ref"})");
}

// PyTorch's runs of every config (and of the stop and resume), from one live run of the
// reference, made by the first test that needs it.
const google::protobuf::Value* Reference(std::string* error) {
  static std::string failure;
  static const google::protobuf::Value* reference = [&]() -> google::protobuf::Value* {
    std::string configs = "{";
    for (const Config& c : Configs()) {
      absl::StrAppend(&configs, configs.size() > 1 ? ", " : "", "\"", c.name, "\": ", c.json);
    }
    absl::StrAppend(&configs, ", \"powersgd_stop\": ", StopConfigJson(),
                    ", \"powersgd_resume\": ", ResumeConfigJson(), "}");
    SpawnOptions o;
    o.argv = {DDP_REFERENCE_PYTHON,
              testing::SourceDir() + "/tests/libddp/comm_hook_reference.py", configs};
    o.capture_stdout = true;
    auto proc = Subprocess::Spawn(o);
    if (!proc.ok()) {
      failure = proc.status().ToString();
      return nullptr;
    }
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = ::read((*proc)->stdout_fd(), buf, sizeof(buf))) > 0;) out.append(buf, n);
    const ExitStatus exit = (*proc)->Wait();
    if (!exit.ok()) {
      failure = "comm_hook_reference.py: " + exit.ToString();
      return nullptr;
    }
    auto json = testing::ParseJson(out);
    if (!json.ok()) {
      failure = json.status().ToString() + "\n" + out;
      return nullptr;
    }
    return new google::protobuf::Value(*json);  // Lives as long as the process.
  }();
  *error = failure;
  return reference;
}

class CommHookParityTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

// libddp's run of `config` over `world` ranks, per rank.
std::vector<RankRun> RunProgram(const Config& config, int world, std::string* error) {
  const std::string dir = testing::MakeTempDir(absl::StrCat("libddp-hook-", config.name));
  testing::TrainerLaunch launch;
  launch.world_size = world;
  launch.cwd = dir;
  launch.command = {DDP_COMM_HOOK_PROGRAM, "--out", dir + "/run"};
  for (const std::string& f : config.flags) launch.command.push_back(f);
  auto results = testing::RunTrainers(launch);
  std::vector<RankRun> runs;
  if (!results.ok()) {
    *error = results.status().ToString();
    return runs;
  }
  for (const RankResult& r : *results) {
    if (!r.exit.ok()) {
      *error = absl::StrCat("rank ", r.rank, ": ", r.exit.ToString(), "\n", r.stderr_text);
      return {};
    }
    auto json = testing::ParseJson(
        testing::ReadFile(absl::StrCat(dir, "/run.rank", r.rank, ".json")));
    if (!json.ok()) {
      *error = json.status().ToString();
      return {};
    }
    runs.push_back(ParseRun(*json));
  }
  return runs;
}

TEST_P(CommHookParityTest, MatchesPyTorchsHookStepForStep) {
  const auto [world, which] = GetParam();
  const Config& config = Configs()[static_cast<size_t>(which)];
  std::string failure;
  const google::protobuf::Value* reference = Reference(&failure);
  ASSERT_NE(reference, nullptr) << failure;
  const auto& fields = reference->struct_value().fields();
  const auto& ref = fields.at(absl::StrCat(config.name, "/world_", world));
  if (ref.has_struct_value()) {
    GTEST_SKIP() << "PyTorch " << fields.at("torch").string_value() << ": "
                 << ref.struct_value().fields().at("unsupported").string_value();
  }
  std::string error;
  const std::vector<RankRun> runs = RunProgram(config, world, &error);
  ASSERT_EQ(runs.size(), static_cast<size_t>(world)) << error;
  const auto& ranks = ref.list_value().values();
  ASSERT_EQ(ranks.size(), static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE(absl::StrCat(config.name, ", rank ", r, " of ", world, ", PyTorch ",
                              fields.at("torch").string_value()));
    const RankRun want = ParseRun(ranks[r]);
    const RankRun& got = runs[static_cast<size_t>(r)];
    ASSERT_EQ(got.losses.size(), want.losses.size());
    double worst = 0;
    int64_t first_apart = -1;  // The first step whose losses are not the same bits.
    for (size_t i = 0; i < want.losses.size(); ++i) {
      EXPECT_NEAR(got.losses[i], want.losses[i], kLossTolerance) << "step " << i;
      worst = std::max(worst, std::abs(got.losses[i] - want.losses[i]));
      if (first_apart < 0 && got.losses[i] != want.losses[i]) first_apart = static_cast<int64_t>(i);
    }
    std::cout << config.name << " world " << world << " rank " << r
              << ": largest loss difference " << worst << ", first differing step "
              << first_apart << " of " << want.losses.size() << "\n";
    if (std::string(config.name) == "none") continue;  // PyTorch's reducer sends its own.
    // The hook all-reduced what PyTorch's hook did, step for step.
    EXPECT_EQ(got.bytes, want.bytes);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Hooks, CommHookParityTest,
    ::testing::Combine(::testing::Values(2, 3), ::testing::Range(0, 5)),
    [](const auto& info) {
      return absl::StrCat(Configs()[static_cast<size_t>(std::get<1>(info.param))].name, "_world",
                          std::get<0>(info.param));
    });

// The bytes each scheme sends, by its formula: the model's trainable parameters are
// 515 float32 (2,060 bytes); fp16 sends half; PowerSGD at rank 1 sends the 51
// uncompressed bias and BatchNorm values plus P and Q of the three weight matrices
// (16x10, 16x16, 3x16): (16+10) + (16+16) + (3+16) = 77, so 128 floats (512 bytes).
TEST(CommHookBytesTest, FollowTheirFormulas) {
  std::string error;
  const auto none = RunProgram(Configs()[0], 2, &error);
  ASSERT_EQ(none.size(), 2u) << error;
  const auto fp16 = RunProgram(Configs()[1], 2, &error);
  ASSERT_EQ(fp16.size(), 2u) << error;
  const auto psgd = RunProgram(Configs()[3], 2, &error);
  ASSERT_EQ(psgd.size(), 2u) << error;
  const int64_t full = (16 * 10 + 2 * 16 + 16 * 16 + 16 + 3 * 16 + 3) * 4;
  for (size_t i = 0; i < none[0].bytes.size(); ++i) {
    EXPECT_EQ(none[0].bytes[i], full);
    EXPECT_EQ(fp16[0].bytes[i], full / 2);
    // Two plain iterations (start_powerSGD_iter 2), then compressed.
    EXPECT_EQ(psgd[0].bytes[i], i < 2 ? full : (51 + 77) * 4) << "step " << i;
  }
}

TEST(CommHookErrorTest, AHookReturningTheWrongShapeIsNamed) {
  std::string error;
  const Config bad{"bad_shape", "", {"--hook", "bad_shape"}};
  EXPECT_TRUE(RunProgram(bad, 2, &error).empty());
  EXPECT_THAT(error, HasSubstr("exit 2"));
  EXPECT_THAT(error, HasSubstr("communication hook: bucket 0: the hook returned a Float tensor "
                               "of shape [257]"));
  EXPECT_THAT(error, HasSubstr("shaped like bucket.buffer(): a Float tensor of shape [515]"));
}

// The built-in trainer's train.comm_hook: the same hooks through job.yaml. PowerSGD's
// first start_iteration steps are plain all-reduces (the same losses as no hook, bit for
// bit on 2 ranks), and it changes the gradients after; fp16 changes them from the
// first step; bf16 runs on LibTorch 2.x and is refused with its fix on 1.13.
std::vector<double> TrainerLosses(const std::string& hook, std::string* error) {
  const std::string dir = testing::MakeTempDir("libddp-trainer-hook");
  const std::string spec = dir + "/job.yaml";
  testing::WriteFile(spec, absl::StrCat(
      "name: hooks\nmodel: {mlp: {hidden: [64, 64]}}\n"
      "data: {synthetic: {samples: 1024, features: 32, classes: 10}}\n"
      "train: {epochs: 1, batch_size: 32, threads: 1, optimizer: {name: sgd, lr: 0.1}, "
      "comm_hook: ", hook, "}\n"));
  auto results = testing::RunTrainers(testing::LaunchOf(spec, 2));
  std::vector<double> losses;
  if (!results.ok()) {
    *error = results.status().ToString();
    return losses;
  }
  for (const RankResult& r : *results) {
    if (!r.exit.ok()) {
      *error = absl::StrCat("rank ", r.rank, ": ", r.exit.ToString(), "\n", r.stderr_text);
      return {};
    }
  }
  for (const auto& e : (*results)[0].OfType("step")) losses.push_back(e.Number("loss"));
  return losses;
}

TEST(TrainerCommHookTest, JobYamlSelectsTheHook) {
  std::string error;
  const std::vector<double> none = TrainerLosses("none", &error);
  ASSERT_EQ(none.size(), 16u) << error;
  const std::vector<double> psgd =
      TrainerLosses("powersgd, powersgd: {rank: 1, start_iteration: 6}", &error);
  ASSERT_EQ(psgd.size(), 16u) << error;
  // Steps 0-5 reduce plainly; step 6's gradients are the first compressed, seen in step 7.
  for (size_t i = 0; i <= 6; ++i) EXPECT_EQ(psgd[i], none[i]) << "step " << i;
  EXPECT_NE(psgd[7], none[7]);
  const std::vector<double> fp16 = TrainerLosses("fp16", &error);
  ASSERT_EQ(fp16.size(), 16u) << error;
  EXPECT_EQ(fp16[0], none[0]);
  bool apart = false;
  for (size_t i = 1; i < fp16.size(); ++i) {
    EXPECT_NEAR(fp16[i], none[i], 1e-2) << "step " << i;
    apart = apart || fp16[i] != none[i];
  }
  EXPECT_TRUE(apart) << "fp16 compression changed no loss";
#if TORCH_VERSION_MAJOR >= 2
  EXPECT_EQ(TrainerLosses("bf16", &error).size(), 16u) << error;
#else
  EXPECT_TRUE(TrainerLosses("bf16", &error).empty());
  EXPECT_THAT(error, HasSubstr("train.comm_hook: bf16 needs a LibTorch 2.x build"));
  EXPECT_THAT(error, HasSubstr("exit 2"));
#endif
}

// A world of one: a real TCPStore and Gloo group on a free loopback port.
std::shared_ptr<ProcessGroup> WorldOfOne() {
  Environment env;
  env.master_addr = "127.0.0.1";
  env.master_port = *::ddp::testing::ClaimPort();
  env.node = "test";
  return ProcessGroup::create(env);
}

ErrorCode CodeOf(const std::function<void()>& f, std::string* what) {
  try {
    f();
  } catch (const Error& e) {
    *what = e.what();
    return e.code();
  }
  *what = "no error";
  return ErrorCode::kInternal;
}

TEST(CommHookErrorTest, MisuseIsRefusedWithWhatToDo) {
  auto group = WorldOfOne();
  auto net = std::make_shared<torch::nn::LinearImpl>(4, 2);
  DistributedDataParallel model(net, group);
  std::string what;
  EXPECT_EQ(CodeOf([&] { model.register_comm_hook(CommHook()); }, &what),
            ErrorCode::kInvalidArgument);
  EXPECT_THAT(what, HasSubstr("the hook is empty"));
  model.register_comm_hook(group, hooks::allreduce_hook);
  EXPECT_EQ(CodeOf([&] { model.register_comm_hook(group, hooks::fp16_compress_hook); }, &what),
            ErrorCode::kInvalidArgument);
  EXPECT_THAT(what, HasSubstr("already registered"));

  // After a backward: too late.
  auto net2 = std::make_shared<torch::nn::LinearImpl>(4, 2);
  DistributedDataParallel late(net2, group);
  late(torch::ones({3, 4})).sum().backward();
  EXPECT_EQ(CodeOf([&] { late.register_comm_hook(group, hooks::fp16_compress_hook); }, &what),
            ErrorCode::kInvalidArgument);
  EXPECT_THAT(what, HasSubstr("before training"));

  // PyTorch's ValueError for PowerSGD that cannot start in the first two iterations.
  hooks::PowerSGDOptions o;
  o.start_powerSGD_iter = 1;
  EXPECT_EQ(CodeOf([&] { hooks::PowerSGDState(group, o); }, &what), ErrorCode::kInvalidArgument);
  EXPECT_THAT(what, HasSubstr("start_powerSGD_iter"));
  o.use_error_feedback = o.warm_start = false;
  hooks::PowerSGDState ok(group, o);  // Allowed then, as in PyTorch.
  EXPECT_EQ(ok.iter(), 0);
}

Config WithFlags(const Config& base, std::vector<std::string> more) {
  Config c = base;
  c.flags.insert(c.flags.end(), more.begin(), more.end());
  return c;
}

// PowerSGD's state through a checkpoint (PowerSGDState::state_dict/load_state_dict, as
// PyTorch pickles PowerSGDState): the run stopped after epoch 3, each rank saving its
// model, optimizer and PowerSGD state, and resumed in new processes gives PyTorch's
// losses and bytes for the same stop and resume (torch.save of the PowerSGDState).
// Neither resumed run is the uninterrupted one bit for bit: DDP's first iteration after
// a start lays a bucket out in the order parameters were registered, later ones in the
// order their gradients arrived, and the saved error feedback is in the later layout
// (the loss of the second step after the resume differs, on both sides alike). Resumed
// without the PowerSGD state, it sends whole buckets again and learns otherwise.
TEST(CommHookStateTest, PowerSGDResumesAsPyTorchsDoes) {
  std::string failure;
  const google::protobuf::Value* reference = Reference(&failure);
  ASSERT_NE(reference, nullptr) << failure;
  const auto& fields = reference->struct_value().fields();
  for (int world : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("world ", world, ", PyTorch ", fields.at("torch").string_value()));
    const Config& psgd = Configs()[3];
    const std::string prefix = absl::StrCat(StateDir(), "/ckpt.world", world);
    std::string error;
    const auto first = RunProgram(
        WithFlags(psgd, {"--stop-after", std::to_string(kStopAfter), "--state", prefix}), world,
        &error);
    ASSERT_EQ(first.size(), static_cast<size_t>(world)) << error;
    const auto resumed = RunProgram(WithFlags(psgd, {"--resume", prefix}), world, &error);
    ASSERT_EQ(resumed.size(), static_cast<size_t>(world)) << error;
    const auto amnesiac =
        RunProgram(WithFlags(psgd, {"--resume", prefix, "--hook-state", "0"}), world, &error);
    ASSERT_EQ(amnesiac.size(), static_cast<size_t>(world)) << error;
    const auto& ref_first = fields.at(absl::StrCat("powersgd_stop/world_", world)).list_value();
    const auto& ref_resumed =
        fields.at(absl::StrCat("powersgd_resume/world_", world)).list_value();
    for (int r = 0; r < world; ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r));
      const size_t rr = static_cast<size_t>(r);
      for (const auto& [part, ours, theirs] :
           {std::tuple{"stopped", &first[rr], ParseRun(ref_first.values(r))},
            std::tuple{"resumed", &resumed[rr], ParseRun(ref_resumed.values(r))}}) {
        SCOPED_TRACE(part);
        ASSERT_EQ(ours->losses.size(), theirs.losses.size());
        ASSERT_FALSE(theirs.losses.empty());
        double worst = 0;
        for (size_t i = 0; i < theirs.losses.size(); ++i) {
          EXPECT_NEAR(ours->losses[i], theirs.losses[i], kLossTolerance) << "step " << i;
          worst = std::max(worst, std::abs(ours->losses[i] - theirs.losses[i]));
        }
        EXPECT_EQ(ours->bytes, theirs.bytes);
        std::cout << "world " << world << " rank " << r << ", " << part << " run ("
                  << theirs.losses.size() << " steps): largest loss difference from PyTorch "
                  << worst << "\n";
      }
      EXPECT_NE(amnesiac[rr].bytes, resumed[rr].bytes);
      EXPECT_NE(amnesiac[rr].losses, resumed[rr].losses);
    }
    // A state saved with other options is refused, naming the option.
    Config other = psgd;
    for (size_t i = 0; i + 1 < other.flags.size(); ++i) {
      if (other.flags[i] == "--rank") other.flags[i + 1] = "2";
    }
    EXPECT_TRUE(RunProgram(WithFlags(other, {"--resume", prefix}), world, &error).empty());
    EXPECT_THAT(error, HasSubstr("saved with matrix_approximation_rank = 1"));
  }
}

// A state_dict() that is not one, or misses an entry, changes nothing and says why.
TEST(CommHookStateTest, ABadStateIsRefusedAndChangesNothing) {
  auto group = WorldOfOne();
  hooks::PowerSGDOptions o;
  o.start_powerSGD_iter = 2;
  hooks::PowerSGDState state(group, o);
  auto saved = state.state_dict();
  std::string what;
  EXPECT_EQ(CodeOf([&] { state.load_state_dict({{"iter", torch::tensor(5)}}); }, &what),
            ErrorCode::kInvalidArgument);
  EXPECT_THAT(what, HasSubstr("not a PowerSGDState's state_dict()"));
  auto extra = saved;
  extra.emplace_back("momentum.0", torch::zeros({2}));
  EXPECT_EQ(CodeOf([&] { state.load_state_dict(extra); }, &what), ErrorCode::kInvalidArgument);
  EXPECT_THAT(what, HasSubstr("unknown entry 'momentum.0'"));
  auto no_iter = saved;
  for (auto& [name, t] : no_iter) {
    if (name == "iter") name = "iteration";
  }
  EXPECT_EQ(CodeOf([&] { state.load_state_dict(no_iter); }, &what), ErrorCode::kInvalidArgument);
  EXPECT_THAT(what, HasSubstr("no 'iter' entry"));
  auto two_iters = saved;
  for (auto& [name, t] : two_iters) {
    if (name == "iter") t = torch::zeros({2}, torch::kLong);
  }
  EXPECT_EQ(CodeOf([&] { state.load_state_dict(two_iters); }, &what), ErrorCode::kInvalidArgument);
  EXPECT_THAT(what, HasSubstr("'iter' is not one number"));
  EXPECT_EQ(state.iter(), 0);
  // And a good one round-trips.
  for (auto& [name, t] : saved) {
    if (name == "iter") t = torch::tensor(int64_t{7});
  }
  state.load_state_dict(saved);
  EXPECT_EQ(state.iter(), 7);
}

// A hook runs on a world of one too (as PyTorch's does), and backward() leaves its
// result in param.grad().
TEST(CommHookTest, ACustomHooksResultIsTheGradient) {
  auto group = WorldOfOne();
  auto net = std::make_shared<torch::nn::LinearImpl>(4, 2);
  DistributedDataParallel model(net, group);
  int calls = 0;
  model.register_comm_hook([&](GradBucket& bucket) {
    ++calls;
    EXPECT_EQ(bucket.index(), 0);
    EXPECT_TRUE(bucket.is_last());
    EXPECT_EQ(bucket.parameters().size(), 2u);
    EXPECT_EQ(bucket.gradients().size(), 2u);
    EXPECT_EQ(bucket.buffer().numel(), 10);
    return bucket.buffer() * 2;
  });
  model(torch::ones({3, 4})).sum().backward();
  EXPECT_EQ(calls, 1);
  // d(sum)/d(bias) = 3 per output, doubled by the hook.
  EXPECT_TRUE(torch::allclose(net->bias.grad(), torch::full({2}, 6.0)));
  EXPECT_EQ(model.last_backward().allreduce_bytes, 0);  // It sent nothing.
}

}  // namespace
}  // namespace ddp
