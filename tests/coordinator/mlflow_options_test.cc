// Which MLflow server a job's run goes to (MlflowServerFor: the coordinator's
// --mlflow-uri and --mlflow-allow against the job's tracking section), and the flags'
// own checks. The runs themselves are tested against a real MLflow server in
// mlflow_tracking_test.
#include "coordinator/core/coordinator.h"
#include "coordinator/server.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

JobSpec Spec(TrackingSpec::Mlflow mlflow, std::string uri = "") {
  JobSpec spec;
  spec.name = "j";
  spec.tracking.mlflow = mlflow;
  spec.tracking.mlflow_uri = std::move(uri);
  return spec;
}

TEST(MlflowOptionsTest, JobsFollowTheCoordinatorsDefaultOrNameAnAllowedServer) {
  CoordinatorOptions o;
  o.mlflow_uri = "http://default:5000";
  o.mlflow_allowed = {"http://other:5000"};
  using M = TrackingSpec::Mlflow;
  EXPECT_EQ(*MlflowServerFor(Spec(M::kDefault), "job.yaml", o), "http://default:5000");
  EXPECT_EQ(*MlflowServerFor(Spec(M::kOn), "job.yaml", o), "http://default:5000");
  EXPECT_EQ(*MlflowServerFor(Spec(M::kOff), "job.yaml", o), "");
  EXPECT_EQ(*MlflowServerFor(Spec(M::kOn, "http://other:5000"), "job.yaml", o),
            "http://other:5000");
  EXPECT_EQ(*MlflowServerFor(Spec(M::kOn, "http://default:5000"), "job.yaml", o),
            "http://default:5000");
  absl::StatusOr<std::string> elsewhere =
      MlflowServerFor(Spec(M::kOn, "http://169.254.169.254"), "job.yaml", o);
  EXPECT_EQ(elsewhere.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(elsewhere.status().message(),
              HasSubstr("job.yaml: tracking.mlflow.uri http://169.254.169.254 is not one of this "
                        "coordinator's MLflow servers (http://default:5000, http://other:5000)"));

  CoordinatorOptions none;  // No MLflow at all: jobs are not tracked unless they ask.
  EXPECT_EQ(*MlflowServerFor(Spec(M::kDefault), "job.yaml", none), "");
  EXPECT_THAT(MlflowServerFor(Spec(M::kOn), "job.yaml", none).status().message(),
              HasSubstr("this coordinator has no MLflow server"));
  EXPECT_THAT(MlflowServerFor(Spec(M::kOn, "http://x:1"), "job.yaml", none).status().message(),
              HasSubstr("(it has none)"));
}

TEST(MlflowOptionsTest, ServerAddressesAreCheckedAtStart) {
  CoordinatorServerOptions o;
  o.state_dir = "/nonexistent-state-dir-unused";
  o.timing.mlflow_uri = "http://127.0.0.1:5000";
  o.timing.mlflow_allowed = {"https://mlflow.example/prefix"};
  EXPECT_TRUE(ValidateServerOptions(o).ok()) << ValidateServerOptions(o);
  for (const std::string bad : {"127.0.0.1:5000", "ftp://x", "http://", "http:///x",
                                "http://x:5000/", "http://x y"}) {
    o.timing.mlflow_uri = bad;
    absl::Status st = ValidateServerOptions(o);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(st.message(), HasSubstr("'" + bad + "' is not an MLflow tracking server")) << bad;
  }
}

}  // namespace
}  // namespace ddp
