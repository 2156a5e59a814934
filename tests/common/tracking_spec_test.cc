// job.yaml's `tracking` section and the spec flattened into MLflow parameters.
#include "common/jobspec/flatten.h"
#include "common/jobspec/job_spec.h"

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Pair;

constexpr char kJob[] =
    "name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\ntrain: {epochs: 1, batch_size: 8}\n";

absl::StatusOr<JobSpec> WithTracking(const std::string& tracking) {
  return ParseJobSpec(absl::StrCat(kJob, "tracking: ", tracking, "\n"), "job.yaml");
}

TEST(TrackingSpecTest, MlflowIsOnOffAServerOrAMapping) {
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec none, ParseJobSpec(kJob));
  EXPECT_EQ(none.tracking.mlflow, TrackingSpec::Mlflow::kDefault);
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec off, WithTracking("{mlflow: false}"));
  EXPECT_EQ(off.tracking.mlflow, TrackingSpec::Mlflow::kOff);
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec on, WithTracking("{mlflow: true}"));
  EXPECT_EQ(on.tracking.mlflow, TrackingSpec::Mlflow::kOn);
  EXPECT_EQ(on.tracking.mlflow_uri, "");
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec uri, WithTracking("{mlflow: 'http://mlflow:5000/'}"));
  EXPECT_EQ(uri.tracking.mlflow, TrackingSpec::Mlflow::kOn);
  EXPECT_EQ(uri.tracking.mlflow_uri, "http://mlflow:5000") << "trailing slashes dropped";
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec both,
                           WithTracking("{mlflow: {uri: 'https://m.example/ml', experiment: x}}"));
  EXPECT_EQ(both.tracking.mlflow_uri, "https://m.example/ml");
  EXPECT_EQ(both.tracking.mlflow_experiment, "x");
  // A command job takes it too.
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec command,
                           ParseJobSpec("name: c\ncommand: [true]\ntracking: {mlflow: true}\n"));
  EXPECT_EQ(command.tracking.mlflow, TrackingSpec::Mlflow::kOn);
}

TEST(TrackingSpecTest, BadTrackingNamesTheFieldAndWhatItTakes) {
  EXPECT_THAT(WithTracking("{mlflow: 'ftp://x'}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml:5: tracking.mlflow: 'ftp://x' is not an MLflow "
                                 "tracking server's address")));
  EXPECT_THAT(WithTracking("{mlflow: {uri: 'http:///path'}}"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tracking.mlflow.uri")));
  EXPECT_THAT(WithTracking("{mlflow: {experiment: ''}}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tracking.mlflow.experiment: must be 1 to 500 bytes")));
  EXPECT_THAT(WithTracking("{mlflow: {experimnet: x}}"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("did you mean experiment")));
  EXPECT_THAT(WithTracking("{wandb: true}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tracking.wandb: unknown field")));
  EXPECT_THAT(WithTracking("{mlflow: [1]}"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tracking.mlflow")));
}

TEST(FlattenSpecTest, EveryScalarUnderItsPathInOrderWithoutEnv) {
  DDP_ASSERT_OK_AND_ASSIGN(auto params, FlattenSpec(R"(name: cancer
env: {API_TOKEN: secret, OTHER: x}
model: {mlp: {hidden: [32, 16]}}
data:
  csv: {path: data/x.csv}
  empty:
train: {optimizer: {name: sgd, lr: 0.1}}
command_args: [{a: 1}, {b: [x, y]}]
)"));
  EXPECT_THAT(params, ::testing::ElementsAre(
                          Pair("name", "cancer"), Pair("model.mlp.hidden", "[32, 16]"),
                          Pair("data.csv.path", "data/x.csv"), Pair("train.optimizer.name", "sgd"),
                          Pair("train.optimizer.lr", "0.1"), Pair("command_args.0.a", "1"),
                          Pair("command_args.1.b", "[x, y]")));
  for (const auto& [k, v] : params) EXPECT_EQ(v.find("secret"), std::string::npos) << k;
}

TEST(FlattenSpecTest, LongKeysAndValuesAreCutToMlflowsLimits) {
  const std::string key(300, 'k');
  std::string value;
  for (int i = 0; i < 4000; ++i) value += "é";  // 8,000 bytes of two-byte characters.
  DDP_ASSERT_OK_AND_ASSIGN(auto params, FlattenSpec(absl::StrCat(key, ": ", value, "\n")));
  ASSERT_EQ(params.size(), 1u);
  EXPECT_EQ(params[0].first.size(), 250u);
  EXPECT_LE(params[0].second.size(), 6000u);
  EXPECT_THAT(params[0].second, ::testing::EndsWith("..."));
  // Cut between characters: what is left is whole two-byte sequences.
  EXPECT_EQ((params[0].second.size() - 3) % 2, 0u);
  EXPECT_THAT(FlattenSpec("a: [unclosed\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not valid YAML")));
}

}  // namespace
}  // namespace ddp
