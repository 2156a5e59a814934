// The coordinator's composition root in-process: a real gRPC server on a loopback
// port with a scratch state directory, reached through raw stubs.
#include "coordinator/server.h"

#include <unistd.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/common/test_util.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::HasSubstr;

CoordinatorServerOptions Options(const std::string& state_dir, int port = 0) {
  CoordinatorServerOptions o;
  o.listen = absl::StrCat("127.0.0.1:", port);
  o.state_dir = state_dir;
  return o;
}

TEST(CoordinatorServerTest, ASecondServerOnTheSameStateDirFailsWithAClearError) {
  const std::string dir = testing::MakeTempDir("server-dir");
  auto first = CoordinatorServer::Start(Options(dir));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_THAT(CoordinatorServer::Start(Options(dir)),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr(absl::StrCat("state dir ", dir,
                                              " is in use by another ddp-coordinator (pid ",
                                              ::getpid(), "?)"))));
  first->reset();
  auto again = CoordinatorServer::Start(Options(dir));
  EXPECT_TRUE(again.ok()) << "the directory is free once the first server is gone: "
                          << again.status();
}

TEST(CoordinatorServerTest, ASecondServerCannotShareTheListenPort) {
  auto first = CoordinatorServer::Start(Options(testing::MakeTempDir("server-port-a")));
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = (*first)->port();
  // gRPC would set SO_REUSEPORT and let both bind, splitting clients between them.
  EXPECT_THAT(CoordinatorServer::Start(Options(testing::MakeTempDir("server-port-b"), port)),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr(absl::StrCat("cannot listen on 127.0.0.1:", port))));
}

TEST(CoordinatorServerTest, BadOptionsNameTheFlag) {
  CoordinatorServerOptions o = Options(testing::MakeTempDir("server-flags"));
  o.retention.max_metric_rows = 0;
  EXPECT_THAT(ValidateServerOptions(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                                 HasSubstr("--max-metric-rows: must be >= 1")));
  o = Options("");
  EXPECT_THAT(ValidateServerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--state-dir is required")));
}

}  // namespace
}  // namespace ddp
