// Every event line real ddp-trainer processes write matches the contract
// (common/contract/events.h) exactly as the agent checks it: no unknown, missing or
// mistyped field, and every event type turns up.
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/trainer/trainer_harness.h"
#include "worker/agent/trainer_event_parser.h"

namespace ddp {
namespace {

using testing::RankResult;

// Checks every event of every rank; returns the count per type.
void CheckAll(const std::vector<RankResult>& results, std::map<std::string, int>* seen) {
  for (const RankResult& r : results) {
    for (const testing::Event& e : r.events) {
      v1::TrainerEvent parsed;
      std::vector<std::string> problems;
      ASSERT_TRUE(ParseTrainerEvent(e.fields, &parsed, &problems)) << e.fields.DebugString();
      EXPECT_THAT(problems, ::testing::IsEmpty()) << e.fields.DebugString();
      EXPECT_EQ(parsed.rank(), r.rank);
      const std::string type = e.fields.fields().at("type").string_value();
      // The relayed types arrive in their own typed body; buckets and trace stay local.
      EXPECT_EQ(EventTypeName(parsed), type == "buckets" || type == "trace" ? "" : type);
      ++(*seen)[type];
    }
  }
}

TEST(TrainerEventContractTest, EveryLineARealTrainerWritesMatchesTheDefinitions) {
  const std::string dir = testing::MakeTempDir("event-contract");
  testing::WriteFile(dir + "/job.yaml", R"(name: contract
model: {mlp: {hidden: [16]}}
data: {synthetic: {samples: 512, features: 8, classes: 3}, validation: {fraction: 0.25}}
train: {epochs: 2, batch_size: 16, threads: 1}
checkpoint: {dir: ckpt, every_steps: 5}
metrics: {every_steps: 3, trace_buckets: true}
)");
  std::map<std::string, int> seen;
  // A run, a second one resuming from its checkpoint (resumed_from set)...
  for (int run = 0; run < 2; ++run) {
    DDP_ASSERT_OK_AND_ASSIGN(auto results,
                             testing::RunTrainers(testing::LaunchOf(dir + "/job.yaml", 2)));
    for (const RankResult& r : results) ASSERT_TRUE(r.exit.ok()) << r.stderr_text;
    CheckAll(results, &seen);
  }
  // ...and one that fails.
  testing::WriteFile(dir + "/bad.yaml", R"(name: bad
model: {mlp: {}}
data: {csv: {path: missing.csv}}
train: {batch_size: 4}
)");
  DDP_ASSERT_OK_AND_ASSIGN(auto failed,
                           testing::RunTrainers(testing::LaunchOf(dir + "/bad.yaml", 1)));
  CheckAll(failed, &seen);
  std::set<std::string> types;
  for (const auto& [type, n] : seen) types.insert(type);
  EXPECT_EQ(types, (std::set<std::string>{"start", "buckets", "step", "trace", "epoch",
                                          "checkpoint", "done", "error"}));
}

}  // namespace
}  // namespace ddp
