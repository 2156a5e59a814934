// How real ddp-trainer processes classify their failures: permanent ones (exit 2)
// end the job, a node's fault (exit 3) lets it run elsewhere.
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/contract/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/trainer/trainer_harness.h"

namespace ddp {
namespace {

using testing::RankResult;
using ::testing::HasSubstr;

bool Flag(const testing::Event& e, const std::string& key) {
  auto it = e.fields.fields().find(key);
  return it != e.fields.fields().end() && it->second.bool_value();
}

TEST(TrainerFailureTest, AModelLargerThanTheMachineIsAPermanentError) {
  const std::string dir = testing::MakeTempDir("huge-model");
  // Linear(2^20 features, 65536), the widest job.yaml allows: one 256 GiB weight,
  // refused by the allocator at once on any machine with less memory.
  testing::WriteFile(dir + "/job.yaml", R"(name: huge
model: {mlp: {hidden: [65536]}}
data: {synthetic: {samples: 16, features: 1048576}}
train: {batch_size: 8, threads: 1}
)");
  DDP_ASSERT_OK_AND_ASSIGN(auto results,
                           testing::RunTrainers(testing::LaunchOf(dir + "/job.yaml", 1)));
  const RankResult& r = results[0];
  EXPECT_EQ(r.exit.exit_code, kExitPermanent) << r.exit.ToString() << "\n" << r.stderr_text;
  auto errors = r.OfType("error");
  ASSERT_EQ(errors.size(), 1u) << r.stderr_text;
  EXPECT_THAT(errors[0].String("message"), HasSubstr("exceeds this machine's whole memory"));
  EXPECT_FALSE(Flag(errors[0], "retryable"));
  EXPECT_FALSE(Flag(errors[0], "node_fault"));
}

TEST(TrainerFailureTest, ADeviceThisNodeLacksIsTheNodesFault) {
#if DDP_WITH_CUDA
  GTEST_SKIP() << "this ddp-trainer has CUDA: these jobs may well run here (library_unit_test "
                  "and libddp_cuda_test cover a CUDA build without a GPU)";
#endif
  // NCCL, and Gloo's CUDA path (train.device: cuda), on a node without a GPU.
  for (const auto& [backend, device] :
       std::vector<std::pair<std::string, std::string>>{{"nccl", "auto"}, {"gloo", "cuda"}}) {
    SCOPED_TRACE(backend + " on device " + device);
    const std::string dir = testing::MakeTempDir("no-gpu");
    testing::WriteFile(dir + "/job.yaml", "name: nogpu\nbackend: " + backend +
                                              "\nmodel: {mlp: {}}\n"
                                              "data: {synthetic: {samples: 64, features: 8}}\n"
                                              "train: {batch_size: 8, device: " + device + "}\n");
    DDP_ASSERT_OK_AND_ASSIGN(auto results,
                             testing::RunTrainers(testing::LaunchOf(dir + "/job.yaml", 1)));
    const RankResult& r = results[0];
    EXPECT_EQ(r.exit.exit_code, kExitNodeFault) << r.exit.ToString() << "\n" << r.stderr_text;
    auto errors = r.OfType("error");
    ASSERT_EQ(errors.size(), 1u) << r.stderr_text;
    EXPECT_THAT(errors[0].String("message"),
                HasSubstr("backend " + backend + " on device cuda needs"));
    EXPECT_TRUE(Flag(errors[0], "retryable"));
    EXPECT_TRUE(Flag(errors[0], "node_fault"));
  }
}

TEST(TrainerFailureTest, ACudaGraphRequiredOnANodeWithoutAGpuIsTheNodesFault) {
  if (std::filesystem::exists("/dev/nvidiactl")) {
    GTEST_SKIP() << "an NVIDIA driver is here: the graph may well be captured";
  }
  // train.cuda_graph: true with the device left to auto: a node with a GPU can run it.
  const std::string dir = testing::MakeTempDir("graph-no-gpu");
  testing::WriteFile(dir + "/job.yaml", "name: graph\nmodel: {mlp: {}}\n"
                                        "data: {synthetic: {samples: 64, features: 8}}\n"
                                        "train: {batch_size: 8, cuda_graph: true}\n");
  DDP_ASSERT_OK_AND_ASSIGN(auto results,
                           testing::RunTrainers(testing::LaunchOf(dir + "/job.yaml", 1)));
  const RankResult& r = results[0];
  EXPECT_EQ(r.exit.exit_code, kExitNodeFault) << r.exit.ToString() << "\n" << r.stderr_text;
  auto errors = r.OfType("error");
  ASSERT_EQ(errors.size(), 1u) << r.stderr_text;
  EXPECT_THAT(errors[0].String("message"),
              HasSubstr("train.cuda_graph: true, but this node cannot capture the step"));
  EXPECT_TRUE(Flag(errors[0], "node_fault"));
  // Training started nowhere: no step was taken eagerly instead.
  EXPECT_TRUE(r.OfType("step").empty());
}

}  // namespace
}  // namespace ddp
