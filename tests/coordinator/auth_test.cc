// The authorization table and the token file, without sockets: who may call what.
#include "coordinator/rpc/auth.h"

#include "common/auth/tokens.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/common/test_util.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kAdmin[] = "admin-token-0123456789";
constexpr char kUser[] = "user-token-0123456789a";
constexpr char kViewer[] = "viewer-token-012345678";
constexpr char kWorker[] = "worker-token-01234567";

std::unique_ptr<Authorizer> MakeAuthorizer(bool certificates) {
  const std::string path = testing::MakeTempDir("auth") + "/tokens";
  testing::WriteFile(path, absl::StrCat("# comment\n", kAdmin, " admin alice\n", kUser,
                                        " user bob  # trailing comment\n", kViewer, " viewer\n",
                                        kWorker, " worker w1\n"));
  auto a = Authorizer::Create({path, certificates});
  EXPECT_TRUE(a.ok()) << a.status();
  return std::move(*a);
}

PresentedCredentials Bearer(const std::string& token) {
  PresentedCredentials p;
  p.authorization = "Bearer " + token;
  return p;
}

TEST(TokenTableTest, ParsesRolesAndNamesAndRefusesBadLinesWithoutEchoingTokens) {
  auto t = TokenTable::Parse(absl::StrCat(kAdmin, " admin\n", kWorker, " worker w9\n"), "f");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->Find(kAdmin)->name, "admin") << "the name defaults to the role";
  EXPECT_EQ(t->Find(kWorker)->name, "w9");
  EXPECT_FALSE(t->Find("admin-token-0123456788").has_value());
  EXPECT_FALSE(t->Find("").has_value());

  EXPECT_THAT(TokenTable::Parse("short admin\n", "f"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("f:1: a token must be at least 16 characters")));
  EXPECT_THAT(TokenTable::Parse(absl::StrCat("\n", kAdmin, " root\n"), "f"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("f:2: unknown role 'root' (roles: admin, user, viewer, worker)")));
  EXPECT_THAT(TokenTable::Parse(absl::StrCat(kWorker, " worker\n"), "f"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("f:1: a worker token needs the worker's name")));
  auto dup = TokenTable::Parse(absl::StrCat(kAdmin, " admin\n", kAdmin, " viewer\n"), "f");
  EXPECT_THAT(dup, StatusIs(absl::StatusCode::kInvalidArgument,
                            HasSubstr("f:2: this token is already listed")));
  EXPECT_THAT(dup.status().message(), Not(HasSubstr(kAdmin)));
}

TEST(AuthorizerTest, EachMethodAdmitsExactlyTheRolesInItsRow) {
  auto auth = MakeAuthorizer(/*certificates=*/false);
  const std::vector<std::pair<Method, std::vector<const char*>>> table = {
      {Method::kSubmitJob, {kAdmin, kUser}},   {Method::kCancelJob, {kAdmin, kUser}},
      {Method::kGetJob, {kAdmin, kUser, kViewer}},
      {Method::kListJobs, {kAdmin, kUser, kViewer}},
      {Method::kWatchJob, {kAdmin, kUser, kViewer}},
      {Method::kStreamLogs, {kAdmin, kUser, kViewer}},
      {Method::kListWorkers, {kAdmin, kUser, kViewer}},
      {Method::kCordonWorker, {kAdmin}},       {Method::kDrainWorker, {kAdmin}},
      {Method::kUncordonWorker, {kAdmin}},     {Method::kRemoveWorker, {kAdmin}},
      {Method::kCaptureStacks, {kAdmin, kUser}},
      {Method::kRegister, {kWorker}},           {Method::kHeartbeat, {kWorker}},
      {Method::kReportEvents, {kWorker}},
  };
  for (const auto& [method, allowed] : table) {
    for (const char* token : {kAdmin, kUser, kViewer, kWorker}) {
      const bool ok = std::find(allowed.begin(), allowed.end(), token) != allowed.end();
      auto id = auth->Authorize(Bearer(token), method, "w1");
      if (ok) {
        EXPECT_TRUE(id.ok()) << MethodName(method) << " " << token << ": " << id.status();
      } else {
        EXPECT_THAT(id, StatusIs(absl::StatusCode::kPermissionDenied,
                                 HasSubstr(absl::StrCat("may not call ", MethodName(method)))))
            << token;
      }
    }
  }
  EXPECT_EQ(auth->Authorize(Bearer(kUser), Method::kSubmitJob)->name, "bob");
}

TEST(AuthorizerTest, MissingMalformedAndUnknownCredentialsAreUnauthenticated) {
  auto auth = MakeAuthorizer(false);
  EXPECT_THAT(auth->Authorize({}, Method::kListJobs),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("DDP_TOKEN")));
  PresentedCredentials basic;
  basic.authorization = "Basic abc";
  EXPECT_THAT(auth->Authorize(basic, Method::kListJobs),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("`Bearer <token>`")));
  EXPECT_THAT(auth->Authorize(Bearer("nope-nope-nope-nope"), Method::kHeartbeat, "w1"),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("--token-file holding a `worker` token")));
}

TEST(AuthorizerTest, AWorkerSpeaksOnlyForItselfByCertificateOrToken) {
  auto auth = MakeAuthorizer(/*certificates=*/true);
  PresentedCredentials cert;
  cert.certificate_names = {"node-a", "node-a.example.com"};
  EXPECT_TRUE(auth->Authorize(cert, Method::kRegister, "node-a").ok());
  EXPECT_TRUE(auth->Authorize(cert, Method::kRegister, "node-a.example.com").ok()) << "a SAN";
  EXPECT_THAT(auth->Authorize(cert, Method::kHeartbeat, "node-b"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("worker node-a may not speak for worker 'node-b'")));
  EXPECT_THAT(auth->Authorize(cert, Method::kSubmitJob),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("worker identities may call only WorkerService")));
  EXPECT_THAT(auth->Authorize(Bearer(kWorker), Method::kReportEvents, "w2"),
              StatusIs(absl::StatusCode::kPermissionDenied));
  // A wrong token is refused even alongside a good certificate.
  cert.authorization = "Bearer not-a-known-token-at-all";
  EXPECT_THAT(auth->Authorize(cert, Method::kRegister, "node-a"),
              StatusIs(absl::StatusCode::kUnauthenticated));
}

TEST(AuthorizerTest, WithoutTokensOrCertificatesEveryoneIsTrusted) {
  auto open = Authorizer::Create({});
  ASSERT_TRUE(open.ok());
  EXPECT_EQ((*open)->Authorize({}, Method::kCancelJob)->via, "open");
  EXPECT_EQ((*open)->Authorize({}, Method::kRegister, "any")->name, "any");
  // Certificates alone protect WorkerService; JobService stays open.
  auto certs = Authorizer::Create({"", true});
  ASSERT_TRUE(certs.ok());
  EXPECT_TRUE((*certs)->Authorize({}, Method::kSubmitJob).ok());
  EXPECT_THAT((*certs)->Authorize({}, Method::kRegister, "w1"),
              StatusIs(absl::StatusCode::kUnauthenticated));
}

TEST(AuthorizerTest, AReloadSwapsTokensAndABrokenFileKeepsTheOldOnes) {
  const std::string path = testing::MakeTempDir("reload") + "/tokens";
  testing::WriteFile(path, absl::StrCat(kUser, " user bob\n"));
  auto auth = Authorizer::Create({path, false});
  ASSERT_TRUE(auth.ok());
  testing::WriteFile(path, absl::StrCat(kViewer, " viewer carol\n"));
  ASSERT_TRUE((*auth)->Reload().ok());
  EXPECT_THAT((*auth)->Authorize(Bearer(kUser), Method::kListJobs),
              StatusIs(absl::StatusCode::kUnauthenticated)) << "revoked";
  EXPECT_EQ((*auth)->Authorize(Bearer(kViewer), Method::kListJobs)->name, "carol");
  testing::WriteFile(path, "garbage\n");
  EXPECT_FALSE((*auth)->Reload().ok());
  EXPECT_TRUE((*auth)->Authorize(Bearer(kViewer), Method::kListJobs).ok()) << "kept";
}

}  // namespace
}  // namespace ddp
