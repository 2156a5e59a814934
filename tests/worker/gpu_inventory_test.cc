// GPU discovery through NVML (the real dlopen path, against a fake libnvidia-ml built
// for the test) and how a task's GPUs reach its trainers' environment.
#include "worker/agent/gpu_inventory.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/common/test_util.h"
#include "worker/agent/event_buffer.h"
#include "worker/agent/output_pump.h"
#include "worker/agent/trainer_task.h"

namespace ddp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::IsOk;
using testing::StatusIs;

class NvmlTest : public ::testing::Test {
 protected:
  void TearDown() override {
    unsetenv("FAKE_NVML_GPUS");
    unsetenv("FAKE_NVML_INIT_ERROR");
  }
};

TEST_F(NvmlTest, AMissingLibraryMeansACpuNode) {
  auto inv = NvmlGpuInventory::Open("/nonexistent/libnvidia-ml.so.1");
  EXPECT_THAT(inv.status(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("cannot load")));
}

TEST_F(NvmlTest, ListsEveryGpuWithUuidModelAndMemory) {
  setenv("FAKE_NVML_GPUS",
         "GPU-0a1b|NVIDIA H100 80GB HBM3|81559|1024|37;GPU-2c3d|NVIDIA H100 80GB HBM3|81559|0|0",
         1);
  auto inv = NvmlGpuInventory::Open(FAKE_NVML_LIBRARY);
  ASSERT_THAT(inv.status(), IsOk());
  const std::vector<GpuDevice>& devices = (*inv)->Devices();
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].index, 0);
  EXPECT_EQ(devices[0].uuid, "GPU-0a1b");
  EXPECT_EQ(devices[0].model, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(devices[0].memory_bytes, int64_t{81559} << 20);
  EXPECT_EQ(devices[1].index, 1);
  EXPECT_EQ(devices[1].uuid, "GPU-2c3d");

  auto usage = (*inv)->Usage();
  ASSERT_THAT(usage.status(), IsOk());
  ASSERT_EQ(usage->size(), 2u);
  EXPECT_EQ((*usage)[0].uuid, "GPU-0a1b");
  EXPECT_EQ((*usage)[0].memory_used_bytes, int64_t{1024} << 20);
  EXPECT_EQ((*usage)[0].utilization_percent, 37);
  EXPECT_EQ((*usage)[1].utilization_percent, 0);
}

TEST_F(NvmlTest, ANodeWithNvmlButNoGpusHasNone) {
  auto inv = NvmlGpuInventory::Open(FAKE_NVML_LIBRARY);
  ASSERT_THAT(inv.status(), IsOk());
  EXPECT_TRUE((*inv)->Devices().empty());
}

TEST_F(NvmlTest, AFailingDriverIsUnavailableWithNvmlsMessage) {
  setenv("FAKE_NVML_INIT_ERROR", "9", 1);  // NVML_ERROR_DRIVER_NOT_LOADED
  auto inv = NvmlGpuInventory::Open(FAKE_NVML_LIBRARY);
  EXPECT_THAT(inv.status(), StatusIs(absl::StatusCode::kUnavailable,
                                     HasSubstr("nvmlInit_v2 failed: Driver Not Loaded")));
}

// ddp-worker --gpus: a Slurm task offers the GPUs Slurm gave it (CUDA_VISIBLE_DEVICES,
// SLURM_STEP_GPUS), by index or UUID.
std::vector<GpuDevice> FourGpus() {
  return {{0, "GPU-0a1b", "H100", 1}, {1, "GPU-2c3d", "H100", 1}, {2, "GPU-2c4e", "H100", 1},
          {3, "GPU-5f6a", "H100", 1}};
}

std::vector<int> Indices(const std::vector<GpuDevice>& gpus) {
  std::vector<int> out;
  for (const GpuDevice& g : gpus) out.push_back(g.index);
  return out;
}

TEST(SelectGpusTest, AllAndNone) {
  EXPECT_THAT(Indices(*SelectGpus(FourGpus(), "all")), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(Indices(*SelectGpus(FourGpus(), "")), ElementsAre(0, 1, 2, 3));
  EXPECT_TRUE(SelectGpus(FourGpus(), "none")->empty());
  EXPECT_TRUE(SelectGpus({}, "none")->empty());
}

TEST(SelectGpusTest, IndicesAndUuidsInTheNodesOrder) {
  EXPECT_THAT(Indices(*SelectGpus(FourGpus(), "3,1")), ElementsAre(1, 3));
  EXPECT_THAT(Indices(*SelectGpus(FourGpus(), "GPU-5f6a, 0")), ElementsAre(0, 3));
  EXPECT_THAT(Indices(*SelectGpus(FourGpus(), "GPU-2c3")), ElementsAre(1));  // A unique prefix.
}

TEST(SelectGpusTest, WhatIsNotOneGpuOfTheNodeIsRefused) {
  EXPECT_THAT(SelectGpus(FourGpus(), "4").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'4' is no GPU of this node")));
  EXPECT_THAT(SelectGpus({}, "0").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("which has 0")));
  EXPECT_THAT(SelectGpus(FourGpus(), "GPU-2c").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("UUIDs of 2 GPUs")));
  EXPECT_THAT(SelectGpus(FourGpus(), "1,GPU-2c3d").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("named twice")));
  EXPECT_THAT(SelectGpus(FourGpus(), "0,,1").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'' is no GPU")));
}

// A task's trainers, with a fake ddp-trainer that records what CUDA_VISIBLE_DEVICES it
// was given.
// A built-in trainer job: the fake trainer below ignores it, the agent reads its kind.
constexpr char kSpec[] = "name: j\nmodel: {mlp: {}}\ndata: {synthetic: {}}\ntrain: {batch_size: 4}\n";

class TaskGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("task-gpu");
    trainer_ = dir_ + "/fake-trainer.sh";
    testing::WriteFile(trainer_,
                       "#!/bin/sh\n"
                       "if [ \"${CUDA_VISIBLE_DEVICES+set}\" = set ]; then\n"
                       "  echo \"[$CUDA_VISIBLE_DEVICES]\" > \"" + dir_ + "/rank-$RANK\"\n"
                       "else\n"
                       "  echo unset > \"" + dir_ + "/rank-$RANK\"\n"
                       "fi\n");
    chmod(trainer_.c_str(), 0755);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Runs `task` to completion and returns what each local rank saw.
  std::vector<std::string> Run(v1::Task task, bool node_has_gpus) {
    task.set_job_id("j");
    task.set_attempt(1);
    task.set_workdir(dir_);
    task.set_world_size(task.ranks_size());
    task.set_master_addr("127.0.0.1");
    task.set_master_port(1);
    task.set_spec_yaml(kSpec);
    TrainerTaskOptions o;
    o.trainer_path = trainer_;
    o.work_dir = dir_ + "/work";
    o.node_has_gpus = node_has_gpus;
    EventBuffer buffer;
    OutputPump pump(&buffer, RealClock());
    auto t = TrainerTask::Start(task, o, &pump);
    EXPECT_EQ(t->error(), "");
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (!t->Finished() && absl::Now() < deadline) {
      t->Poll(absl::Now());
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_TRUE(t->Finished());
    std::vector<std::string> seen;
    for (int r : task.ranks()) {
      std::string s = testing::ReadFile(dir_ + "/rank-" + std::to_string(r));
      seen.push_back(s.substr(0, s.find('\n')));
    }
    return seen;
  }

  std::string dir_;
  std::string trainer_;
};

TEST_F(TaskGpuTest, EachRankSeesExactlyItsOwnGpu) {
  v1::Task task;
  task.add_ranks(4);
  task.add_ranks(5);
  task.add_gpu_uuids("GPU-2c3d");
  task.add_gpu_uuids("GPU-0a1b");
  (*task.mutable_env())["CUDA_VISIBLE_DEVICES"] = "0,1,2,3";  // The job cannot widen it.
  EXPECT_THAT(Run(task, /*node_has_gpus=*/true), ElementsAre("[GPU-2c3d]", "[GPU-0a1b]"));
}

TEST_F(TaskGpuTest, ACpuTaskOnAGpuNodeSeesNoGpu) {
  v1::Task task;
  task.add_ranks(0);
  EXPECT_THAT(Run(task, /*node_has_gpus=*/true), ElementsAre("[]"));
}

TEST_F(TaskGpuTest, ACpuNodeLeavesTheVariableAlone) {
  v1::Task task;
  task.add_ranks(0);
  EXPECT_THAT(Run(task, /*node_has_gpus=*/false), ElementsAre("unset"));
}

TEST_F(TaskGpuTest, AGpuListThatDoesNotMatchTheRanksIsRefused) {
  v1::Task task;
  task.set_job_id("j");
  task.set_attempt(1);
  task.add_ranks(0);
  task.add_ranks(1);
  task.add_gpu_uuids("GPU-0a1b");
  task.set_spec_yaml(kSpec);
  TrainerTaskOptions o;
  o.trainer_path = trainer_;
  o.work_dir = dir_ + "/work";
  EventBuffer buffer;
  OutputPump pump(&buffer, RealClock());
  auto t = TrainerTask::Start(task, o, &pump);
  EXPECT_THAT(t->error(), HasSubstr("names 1 GPU(s) for 2 local rank(s)"));
  EXPECT_TRUE(t->Finished());
}

}  // namespace
}  // namespace ddp
