// train.lr_schedule's closed forms give, step by step, the learning rates PyTorch's
// own schedulers set (tests/fixtures/lr_schedules.json, made by scripts/gen_fixtures.py
// from torch.optim.lr_scheduler's StepLR, CosineAnnealingLR, LinearLR and
// SequentialLR), each configuration read through job.yaml's parser.
#include "ddp/lr_schedule.h"
#include "trainer/trainer.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/common/test_util.h"
#include "tests/trainer/trainer_harness.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::HasSubstr;

JobSpec WithSchedule(const std::string& flow) {
  auto spec = ParseJobSpec(absl::StrCat("name: s\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                                        "train: {batch_size: 4, lr_schedule: ",
                                        flow, "}\n"));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : JobSpec();
}

TEST(LrScheduleTest, EveryStepMatchesTorchOptimLrScheduler) {
  auto fixture = testing::ParseJson(
      testing::ReadFile(testing::SourceDir() + "/tests/fixtures/lr_schedules.json"));
  ASSERT_TRUE(fixture.ok()) << fixture.status();
  const auto& cases = fixture->struct_value().fields().at("cases").list_value();
  ASSERT_GE(cases.values_size(), 7);
  for (const auto& c : cases.values()) {
    const auto& f = c.struct_value().fields();
    std::string flow;
    ASSERT_TRUE(google::protobuf::util::MessageToJsonString(f.at("schedule"), &flow).ok());
    const JobSpec spec = WithSchedule(flow);
    const double base = f.at("base_lr").number_value();
    const auto total = static_cast<int64_t>(f.at("total").number_value());
    const auto& lrs = f.at("lrs").list_value();
    for (int k = 0; k < lrs.values_size(); ++k) {
      EXPECT_NEAR(scheduled_lr(spec.train.lr_schedule, base, k, total),
                  lrs.values(k).number_value(), 1e-12)
          << flow << " after " << k << " scheduler steps";
    }
  }
}

TEST(LrScheduleTest, TheRunsLengthCountsStepsOrEpochsCappedByMaxSteps) {
  LrSchedule s;
  EXPECT_EQ(ScheduleIntervals(s, 3, 28, 0), 84);
  EXPECT_EQ(ScheduleIntervals(s, 3, 28, 50), 50);
  s.interval = LrSchedule::Interval::kEpoch;
  EXPECT_EQ(ScheduleIntervals(s, 3, 28, 50), 3);
}

TEST(LrScheduleTest, NoScheduleKeepsTheOptimizersLr) {
  const JobSpec spec = WithSchedule("{name: constant}");
  EXPECT_EQ(scheduled_lr(spec.train.lr_schedule, 0.25, 1000, 10), 0.25);
  EXPECT_EQ(scheduled_lr(JobSpec().train.lr_schedule, 0.25, 7, 10), 0.25);
}

TEST(LrScheduleTest, BadSchedulesNameTheField) {
  const std::string head = "name: s\nmodel: {mlp: {}}\ndata: {synthetic: {}}\ntrain:\n  batch_size: 4\n";
  EXPECT_THAT(ParseJobSpec(head + "  lr_schedule: {name: cosine, gamma: 0.5}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml:6: train.lr_schedule.gamma: applies to name: step only")));
  EXPECT_THAT(ParseJobSpec(head + "  lr_schedule: {name: exp}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.lr_schedule.name: must be step, cosine, linear or constant")));
  EXPECT_THAT(ParseJobSpec(head + "  lr_schedule: {name: step, interval: batch}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.lr_schedule.interval: must be step")));
  EXPECT_THAT(ParseJobSpec(head + "  lr_schedule: {name: linear, warmup_start_factor: 0}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("warmup_start_factor: must be in (0, 1]")));
  EXPECT_THAT(ParseJobSpec(head + "  clip_grad_norm: -1\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.clip_grad_norm: must be >= 0")));
}

}  // namespace
}  // namespace ddp
