// libddp against PyTorch: parity_program (written on the public headers only, linked
// against the shared libddp as a user's program is) runs as real ranks forming a real
// Gloo group and must reproduce PyTorch DDP's per-step losses, learning rates and
// validation losses (tests/fixtures/libddp_parity.json, from parity_reference.py) over
// 2 and 3 ranks: gradient accumulation through no_sync(), a frozen parameter, BatchNorm
// buffers, clip_grad_norm and a cosine schedule after a linear warm-up. Its checkpoints
// must resume to the same losses, and a bad environment must fail with a clear error.
#include <unistd.h>

#include <signal.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/contract/exit_codes.h"
#include "common/process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/ports.h"
#include "tests/common/status_matchers.h"
#include "tests/common/test_util.h"
#include "tests/trainer/trainer_harness.h"

namespace ddp {
namespace {

using testing::Event;
using testing::RankResult;
using ::testing::HasSubstr;

constexpr double kLossTolerance = 1e-5;

struct Reference {
  std::vector<double> losses, lrs, val;
};

std::vector<double> Numbers(const google::protobuf::Value& list) {
  std::vector<double> out;
  for (const auto& v : list.list_value().values()) out.push_back(v.number_value());
  return out;
}

// The references: PyTorch 1.13's (Debian's) and 2.11's (PyPI's), the same script's output
// under each (tests/fixtures/libddp_parity.json, tests/fixtures/torch2/...).
constexpr const char* kReferences[] = {"libddp_parity.json", "torch2/libddp_parity.json"};

std::vector<Reference> LoadReference(int world, const std::string& file = kReferences[0]) {
  const std::string text = testing::ReadFile(testing::SourceDir() + "/tests/fixtures/" + file);
  auto json = testing::ParseJson(text);
  EXPECT_TRUE(json.ok()) << json.status();
  std::vector<Reference> out;
  const auto& ranks = json->struct_value().fields().at(absl::StrCat("world_", world));
  for (const auto& r : ranks.list_value().values()) {
    const auto& f = r.struct_value().fields();
    out.push_back({Numbers(f.at("losses")), Numbers(f.at("lrs")), Numbers(f.at("val"))});
  }
  return out;
}

testing::TrainerLaunch ProgramLaunch(int world, const std::string& cwd,
                                     std::vector<std::string> args = {}) {
  testing::TrainerLaunch launch;
  launch.world_size = world;
  launch.cwd = cwd;
  launch.command = {DDP_PARITY_PROGRAM};
  for (auto& a : args) launch.command.push_back(std::move(a));
  return launch;
}

// Checks rank r's step and epoch events against the reference from global step
// `first_step` and epoch `first_epoch` on.
void ExpectMatches(const RankResult& r, const Reference& ref, size_t first_step,
                   size_t first_epoch) {
  const std::vector<Event> steps = r.OfType("step");
  ASSERT_EQ(steps.size(), ref.losses.size() - first_step) << "rank " << r.rank;
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].Number("global_step"), static_cast<double>(first_step + i));
    EXPECT_NEAR(steps[i].Number("loss"), ref.losses[first_step + i], kLossTolerance)
        << "rank " << r.rank << " step " << first_step + i;
    EXPECT_NEAR(steps[i].Number("lr"), ref.lrs[first_step + i], 1e-12)
        << "rank " << r.rank << " step " << first_step + i;
  }
  const std::vector<Event> epochs = r.OfType("epoch");
  ASSERT_EQ(epochs.size(), ref.val.size() - first_epoch) << "rank " << r.rank;
  for (size_t e = 0; e < epochs.size(); ++e) {
    EXPECT_NEAR(epochs[e].Number("val_loss"), ref.val[first_epoch + e], kLossTolerance)
        << "rank " << r.rank << " epoch " << first_epoch + e;
  }
}

class LibraryParityTest : public ::testing::TestWithParam<int> {};

TEST_P(LibraryParityTest, MatchesPyTorchDdpStepForStep) {
  const int world = GetParam();
  const std::string dir = testing::MakeTempDir("libddp-parity");
  auto results = testing::RunTrainers(ProgramLaunch(world, dir));
  ASSERT_TRUE(results.ok()) << results.status();
  for (const RankResult& r : *results) {
    ASSERT_TRUE(r.exit.ok()) << "rank " << r.rank << ": " << r.exit.ToString() << "\n"
                             << r.stderr_text;
    for (const char* file : kReferences) {  // Both PyTorch versions, whichever LibTorch this is.
      SCOPED_TRACE(file);
      const std::vector<Reference> ref = LoadReference(world, file);
      ASSERT_EQ(ref.size(), static_cast<size_t>(world));
      ExpectMatches(r, ref[static_cast<size_t>(r.rank)], 0, 0);
    }
    EXPECT_EQ(r.OfType("done").size(), 1u);
    // The all-reduce ran inside backward: every sync step waited a measured time.
    for (const Event& e : r.OfType("step")) EXPECT_GE(e.Number("comm_ms"), 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, LibraryParityTest, ::testing::Values(2, 3),
                         [](const auto& info) { return absl::StrCat("world", info.param); });

TEST(LibraryCheckpointTest, ResumesToTheSameLosses) {
  const std::vector<Reference> ref = LoadReference(2);
  const std::string dir = testing::MakeTempDir("libddp-resume");
  const std::string ckpt = dir + "/ckpt/{job_id}";
  // First run: one epoch, then its checkpoint, then exit.
  auto first = testing::RunTrainers(
      ProgramLaunch(2, dir, {"--checkpoint-dir", ckpt, "--stop-after-epoch", "0"}));
  ASSERT_TRUE(first.ok()) << first.status();
  for (const RankResult& r : *first) {
    ASSERT_TRUE(r.exit.ok()) << r.stderr_text;
    EXPECT_EQ(r.OfType("step").size(), ref[0].losses.size() / 3);
  }
  const std::vector<Event> saved = (*first)[0].OfType("checkpoint");
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_TRUE(std::filesystem::exists(saved[0].String("path"))) << saved[0].String("path");
  // Second run: resumes at epoch 1 with the model, momentum and schedule it left.
  auto second =
      testing::RunTrainers(ProgramLaunch(2, dir, {"--checkpoint-dir", ckpt}));
  ASSERT_TRUE(second.ok()) << second.status();
  const size_t steps_per_epoch = ref[0].losses.size() / 3;
  for (const RankResult& r : *second) {
    ASSERT_TRUE(r.exit.ok()) << r.stderr_text;
    ExpectMatches(r, ref[static_cast<size_t>(r.rank)], steps_per_epoch, 1);
  }
}

// Under torchrun's static rendezvous the agent hosts the store on MASTER_PORT and tells
// the ranks so (TORCHELASTIC_USE_AGENT_STORE=True): rank 0 must join it, not host its
// own. Here PyTorch's own TCPStore plays the agent: the torch of the flavour under test
// (Debian's, or the venv's for the PyPI flavour: their stores' protocols differ).
TEST(LibraryTorchrunTest, RanksJoinTheAgentsStore) {
  auto port = ::ddp::testing::ClaimPort();
  ASSERT_TRUE(port.ok()) << port.status();
  SpawnOptions agent;
  agent.argv = {DDP_REFERENCE_PYTHON, "-c",
                "import sys, time, torch.distributed as d\n"
                "s = d.TCPStore('127.0.0.1', int(sys.argv[1]), 3, True, wait_for_workers=False)\n"
                "print('ready', flush=True)\n"
                "time.sleep(600)\n",
                std::to_string(*port)};
  agent.capture_stdout = true;
  auto store = Subprocess::Spawn(agent);
  ASSERT_TRUE(store.ok()) << store.status();
  std::string out;
  char buf[256];
  while (out.find("ready") == std::string::npos) {
    const ssize_t n = ::read((*store)->stdout_fd(), buf, sizeof(buf));
    ASSERT_GT(n, 0) << "the store host exited: " << out;
    out.append(buf, static_cast<size_t>(n));
  }
  const std::vector<Reference> ref = LoadReference(2);
  testing::TrainerLaunch launch = ProgramLaunch(2, testing::MakeTempDir("libddp-agent-store"));
  launch.master_port = *port;
  launch.env = {{"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_RESTART_COUNT", "1"}};
  auto results = testing::RunTrainers(launch);
  (*store)->Terminate(absl::Seconds(2));
  ASSERT_TRUE(results.ok()) << results.status();
  for (const RankResult& r : *results) {
    ASSERT_TRUE(r.exit.ok()) << "rank " << r.rank << ": " << r.exit.ToString() << "\n"
                             << r.stderr_text;
    ExpectMatches(r, ref[static_cast<size_t>(r.rank)], 0, 0);
  }
}

TEST(LibraryErrorTest, ALostPeerFailsTheSurvivorsBackwardWithARetryableError) {
  const std::string dir = testing::MakeTempDir("libddp-peer");
  auto group = testing::TrainerGroup::Start(
      ProgramLaunch(2, dir, {"--collective-timeout-s", "20"}));
  ASSERT_TRUE(group.ok()) << group.status();
  testing::TrainerGroup* g = group->get();
  auto results = (*group)->Wait([g](int rank, const Event& e) {
    if (rank == 1 && e.type() == "step") g->Kill(1);
    return false;
  });
  EXPECT_EQ(results[1].exit.signal, SIGKILL);
  // The all-reduce inside rank 0's next backward() fails; it leaves backward() as a
  // ddp::Error, which the program turns into exit code 1: a restart may cure it.
  EXPECT_EQ(results[0].exit.exit_code, kExitRetryable)
      << results[0].exit.ToString() << "\n" << results[0].stderr_text;
  EXPECT_THAT(results[0].stderr_text, HasSubstr("parity_program: "));
}

TEST(LibraryErrorTest, MissingEnvironmentNamesTheVariable) {
  SpawnOptions o;
  o.argv = {DDP_PARITY_PROGRAM};
  o.env = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29999"}};
  o.unset_env = {"MASTER_ADDR"};
  o.capture_stderr = true;
  auto proc = Subprocess::Spawn(o);
  ASSERT_TRUE(proc.ok()) << proc.status();
  std::string err;
  char buf[4096];
  for (ssize_t n; (n = ::read((*proc)->stderr_fd(), buf, sizeof(buf))) > 0;) err.append(buf, n);
  const ExitStatus exit = (*proc)->Wait();
  EXPECT_EQ(exit.exit_code, kExitPermanent) << err;
  EXPECT_THAT(err, HasSubstr("MASTER_ADDR"));
}

}  // namespace
}  // namespace ddp
