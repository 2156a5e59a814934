// Security end to end, with real processes and real TLS: a coordinator serving mTLS
// with tokens, workers presenting certificates made by scripts/make_certs.sh, and
// ddpctl as users run it. What a caller without the right credentials gets, what each
// role may do, the whole demo flow over mTLS, the refusal to serve plaintext beyond
// loopback, and the paths a job may touch on a worker.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <grpcpp/client_context.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/auth/tokens.h"
#include "common/process.h"
#include "common/rpc/credentials.h"
#include "common/rpc/status.h"
#include "ddp/v1/worker_service.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/ports.h"
#include "tests/common/status_matchers.h"
#include "tests/common/test_util.h"
#include "tests/integration/local_cluster.h"

namespace ddp {
namespace {

using testing::BinDir;
using testing::CtlResult;
using testing::LocalCluster;
using testing::RunCapture;
using testing::SourceDir;
using testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

// A synthetic job that runs for a while on two nodes.
std::string WriteJob(const std::string& dir, const std::string& name, int epochs) {
  const std::string path = absl::StrCat(dir, "/", name, ".yaml");
  testing::WriteFile(path, absl::StrCat("name: ", name, R"(
nodes: 2
model: {mlp: {hidden: [32]}}
data: {synthetic: {samples: 4000, features: 16, classes: 4}}
train: {epochs: )", epochs, R"(, batch_size: 32}
metrics: {every_steps: 5}
)"));
  return path;
}

std::string Token(const LocalCluster& c, const std::string& role) {
  auto token = ReadClientToken(c.certs() + "/" + role + ".token");
  EXPECT_TRUE(token.ok()) << token.status();
  return token.ok() ? *token : "";
}

// A WorkerService stub over TLS with the given client certificate and/or token.
std::unique_ptr<v1::WorkerService::Stub> WorkerStub(const LocalCluster& c,
                                                    const std::string& cert_dir,
                                                    const std::string& cert,
                                                    const std::string& token) {
  ChannelSecurity s;
  s.ca_file = c.certs() + "/ca.pem";
  if (!cert.empty()) {
    s.cert_file = cert_dir + "/" + cert + ".pem";
    s.key_file = cert_dir + "/" + cert + ".key";
  }
  s.token = token;
  auto channel = MakeChannel(c.address(), s);
  EXPECT_TRUE(channel.ok()) << channel.status();
  return v1::WorkerService::NewStub(*channel);
}

absl::Status Heartbeat(v1::WorkerService::Stub& stub, const std::string& worker) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::HeartbeatRequest req;
  req.set_worker(worker);
  req.set_incarnation("not-the-real-one");
  v1::HeartbeatResponse resp;
  return FromGrpcStatus(stub.Heartbeat(&ctx, req, &resp));
}

class SecureClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LocalCluster::Options o;
    o.secure = true;
    // Nothing here is about heartbeats: 5 s, as the other clusters that run beside a
    // loaded machine's tests have (2 s lost both workers of a run at once, TLS and all).
    o.heartbeat_timeout = absl::Seconds(5);
    auto cluster = LocalCluster::Start(o);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
  }
  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(SecureClusterTest, MissingOrWrongCredentialsAreRefusedWithHowToPassThem) {
  CtlResult none = cluster_->CtlAs("", {"list"});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_THAT(none.err, HasSubstr("not authenticated: this coordinator requires authentication"));
  EXPECT_THAT(none.err, HasSubstr("--token-file FILE` or the DDP_TOKEN environment variable"));

  const std::string wrong = "wrong-token-0123456789abcdefghij";
  CtlResult bad = RunCapture({BinDir() + "/ddpctl", "list", "--coordinator", cluster_->address(),
                              "--tls-ca", cluster_->certs() + "/ca.pem", "--token-file",
                              [&] {
                                const std::string f = cluster_->dir() + "/wrong.token";
                                testing::WriteFile(f, wrong + "\n");
                                return f;
                              }()},
                             absl::Minutes(1));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, HasSubstr("the token is not valid on this coordinator"));
  EXPECT_EQ(bad.err.find(wrong), std::string::npos) << "a token is never echoed";

  // Plaintext to a TLS port, and TLS trusting another CA, fail at the handshake.
  CtlResult plain = RunCapture({BinDir() + "/ddpctl", "list", "--coordinator",
                                cluster_->address(), "--token-file",
                                cluster_->certs() + "/user.token"},
                               absl::Minutes(1));
  EXPECT_EQ(plain.exit_code, 1);
  EXPECT_THAT(plain.err, HasSubstr("if it serves TLS, pass its CA with --tls-ca"));
  const std::string other = cluster_->dir() + "/other-ca";
  ASSERT_EQ(RunCapture({"/bin/bash", SourceDir() + "/scripts/make_certs.sh", other, "--worker",
                        "w1"},
                       absl::Minutes(1))
                .exit_code,
            0);
  CtlResult foreign = RunCapture({BinDir() + "/ddpctl", "list", "--coordinator",
                                  cluster_->address(), "--tls-ca", other + "/ca.pem",
                                  "--token-file", cluster_->certs() + "/user.token"},
                                 absl::Minutes(1));
  EXPECT_EQ(foreign.exit_code, 1);
  EXPECT_THAT(foreign.err, HasSubstr("the TLS handshake with " + cluster_->address() + " failed"));

  // A worker certificate from another CA never completes the handshake.
  auto stub = WorkerStub(*cluster_, other, "w1", "");
  EXPECT_THAT(Heartbeat(*stub, "w1"), StatusIs(absl::StatusCode::kUnavailable));

  // With valid ones: served.
  CtlResult ok = cluster_->CtlAs("viewer", {"workers"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("w1"));
  auto own = WorkerStub(*cluster_, cluster_->certs(), "w1", "");
  EXPECT_THAT(Heartbeat(*own, "w1"), StatusIs(absl::StatusCode::kFailedPrecondition,
                                              HasSubstr("incarnation")))
      << "authenticated and authorized: the coordinator itself answers (a stale incarnation)";
}

TEST_F(SecureClusterTest, EachIdentityMayCallOnlyWhatItsRoleAllows) {
  // A worker certificate cannot submit.
  ChannelSecurity s;
  s.ca_file = cluster_->certs() + "/ca.pem";
  s.cert_file = cluster_->certs() + "/w1.pem";
  s.key_file = cluster_->certs() + "/w1.key";
  auto channel = MakeChannel(cluster_->address(), s);
  ASSERT_TRUE(channel.ok()) << channel.status();
  auto jobs = v1::JobService::NewStub(*channel);
  grpc::ClientContext ctx;
  v1::SubmitJobRequest submit;
  submit.set_spec_yaml(testing::ReadFile(WriteJob(cluster_->dir(), "sneaky", 1)));
  v1::SubmitJobResponse submitted;
  EXPECT_THAT(FromGrpcStatus(jobs->SubmitJob(&ctx, submit, &submitted)),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("w1 (role worker) may not call SubmitJob")));

  // A client token cannot heartbeat, and a worker cannot speak for another.
  auto user = WorkerStub(*cluster_, "", "", Token(*cluster_, "user"));
  EXPECT_THAT(Heartbeat(*user, "w1"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("user (role user) may not call Heartbeat")));
  auto w1 = WorkerStub(*cluster_, cluster_->certs(), "w1", "");
  EXPECT_THAT(Heartbeat(*w1, "w2"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("worker w1 may not speak for worker 'w2'")));
  auto by_token = WorkerStub(*cluster_, "", "", Token(*cluster_, "w2"));
  EXPECT_THAT(Heartbeat(*by_token, "w1"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("worker w2 may not speak for worker 'w1'")));

  // A viewer reads but cannot cancel; the user who can does.
  CtlResult submit_ok = cluster_->Ctl({"submit", WriteJob(cluster_->dir(), "long", 200)});
  ASSERT_EQ(submit_ok.exit_code, 0) << submit_ok.err;
  const std::string id(absl::StripAsciiWhitespace(submit_ok.out));
  CtlResult viewer_submit = cluster_->CtlAs("viewer", {"submit", WriteJob(cluster_->dir(), "v", 1)});
  EXPECT_EQ(viewer_submit.exit_code, 1);
  EXPECT_THAT(viewer_submit.err, HasSubstr("viewer (role viewer) may not call SubmitJob"));
  CtlResult viewer_cancel = cluster_->CtlAs("viewer", {"cancel", id});
  EXPECT_EQ(viewer_cancel.exit_code, 1);
  EXPECT_THAT(viewer_cancel.err,
              HasSubstr("permission denied: viewer (role viewer) may not call CancelJob: it "
                        "needs role admin or user"));
  EXPECT_EQ(cluster_->CtlAs("viewer", {"get", id}).exit_code, 0);
  CtlResult cancel = cluster_->Ctl({"cancel", id});
  EXPECT_EQ(cancel.exit_code, 0) << cancel.err;

  // Node maintenance is the admin's: a user may not cordon; the admin may, and it is
  // recorded under the admin's name.
  CtlResult user_cordon = cluster_->Ctl({"workers", "cordon", "w1"});
  EXPECT_EQ(user_cordon.exit_code, 1);
  EXPECT_THAT(user_cordon.err, HasSubstr("may not call CordonWorker: it needs role admin"));
  CtlResult admin_cordon = cluster_->CtlAs("admin", {"workers", "cordon", "w1", "-o", "json"});
  EXPECT_EQ(admin_cordon.exit_code, 0) << admin_cordon.err;
  EXPECT_THAT(admin_cordon.out, HasSubstr("\"maintenance_by\":\"admin\""));
  EXPECT_EQ(cluster_->CtlAs("admin", {"workers", "uncordon", "w1"}).exit_code, 0);
}

TEST_F(SecureClusterTest, AUserCancelsOnlyItsOwnJobsAndSeesOnlyItsOwnSecrets) {
  const std::string spec = WriteJob(cluster_->dir(), "owned", 200);
  {
    std::ofstream f(spec, std::ios::app);
    f << "env: {API_KEY: hunter2-secret, NCCL_DEBUG: WARN}\n";
  }
  CtlResult submit = cluster_->CtlAs("admin", {"submit", spec});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string id(absl::StripAsciiWhitespace(submit.out));

  CtlResult get = cluster_->Ctl({"get", id});
  EXPECT_EQ(get.exit_code, 0) << get.err;
  EXPECT_THAT(get.out, ::testing::ContainsRegex("Owner: +admin"));
  CtlResult json = cluster_->Ctl({"get", id, "-o", "json"});
  EXPECT_THAT(json.out, HasSubstr("\"owner\":\"admin\""));
  EXPECT_THAT(json.out, ::testing::ContainsRegex("API_KEY: [^ ]*redacted"));
  EXPECT_EQ(json.out.find("hunter2"), std::string::npos) << "a user is not the owner";
  EXPECT_THAT(cluster_->CtlAs("admin", {"get", id, "-o", "json"}).out, HasSubstr("hunter2-secret"));

  CtlResult cancel = cluster_->Ctl({"cancel", id});
  EXPECT_EQ(cancel.exit_code, 1);
  EXPECT_THAT(cancel.err, HasSubstr(absl::StrCat("permission denied: user may not cancel job ",
                                                 id, ": it belongs to admin")));
  CtlResult own = cluster_->Ctl({"submit", WriteJob(cluster_->dir(), "mine", 200)});
  ASSERT_EQ(own.exit_code, 0) << own.err;
  const std::string own_id(absl::StripAsciiWhitespace(own.out));
  EXPECT_EQ(cluster_->Ctl({"cancel", own_id}).exit_code, 0);
  CtlResult by_admin = cluster_->CtlAs("admin", {"cancel", id});
  EXPECT_EQ(by_admin.exit_code, 0) << by_admin.err;
}

TEST_F(SecureClusterTest, TheDemoFlowRunsOverMutualTlsWithTokens) {
  const std::string spec = testing::StageExample("cancer.yaml", cluster_->dir());
  CtlResult submit = cluster_->Ctl({"submit", spec});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string id(absl::StripAsciiWhitespace(submit.out));
  CtlResult watch = cluster_->Ctl({"watch", id});
  EXPECT_EQ(watch.exit_code, 0) << watch.err;
  EXPECT_THAT(watch.err, HasSubstr("SUCCEEDED"));
  CtlResult get = cluster_->CtlAs("viewer", {"get", id});
  EXPECT_EQ(get.exit_code, 0) << get.err;
  EXPECT_THAT(get.out, HasSubstr("w1"));
  EXPECT_THAT(get.out, HasSubstr("w2"));
  CtlResult logs = cluster_->CtlAs("viewer", {"logs", id, "--tail", "5"});
  EXPECT_EQ(logs.exit_code, 0) << logs.err;
  EXPECT_THAT(logs.out, HasSubstr("[rank"));

  CtlResult second = cluster_->Ctl({"submit", WriteJob(cluster_->dir(), "second", 200)});
  ASSERT_EQ(second.exit_code, 0) << second.err;
  const std::string second_id(absl::StripAsciiWhitespace(second.out));
  auto running = cluster_->WaitFor(second_id, [](const v1::Job& j) {
    return j.state() == v1::RUNNING && j.metrics_size() == 2;
  });
  ASSERT_TRUE(running.ok()) << running.status();
  CtlResult cancel = cluster_->CtlAs("admin", {"cancel", second_id});
  EXPECT_EQ(cancel.exit_code, 0) << cancel.err;
  EXPECT_THAT(cancel.out, HasSubstr("cancelled; its trainers have stopped"));
}

TEST(CoordinatorSafeDefaultsTest, APlaintextNonLoopbackListenExitsWithTheFlagsToAdd) {
  const std::string dir = testing::MakeTempDir("plaintext");
  CtlResult r = RunCapture({BinDir() + "/ddp-coordinator", "--listen", "0.0.0.0:0",
                            "--state-dir", dir + "/state"},
                           absl::Minutes(1));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--listen 0.0.0.0:0 is reachable from other machines, but TLS "
                               "and authentication are not configured: add --tls-cert FILE "
                               "--tls-key FILE [--tls-ca FILE] --auth-token-file FILE"));
  EXPECT_THAT(r.err, HasSubstr("--insecure"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/state")) << "it stopped before touching state";
}

TEST(CredentialRotationTest, NewCertificatesAndTokensApplyWithoutARestart) {
  namespace fs = std::filesystem;
  const std::string dir = testing::MakeTempDir("rotate");
  for (const char* ca : {"old", "new"}) {
    ASSERT_EQ(RunCapture({"/bin/bash", SourceDir() + "/scripts/make_certs.sh", dir + "/" + ca},
                         absl::Minutes(1))
                  .exit_code,
              0);
  }
  const std::string live = dir + "/live";
  fs::create_directories(live);
  // Replaced the way make_certs.sh writes: a new file renamed over the old one.
  auto install = [&](const std::string& from) {
    for (const char* f : {"coordinator.key", "coordinator.pem", "tokens"}) {
      fs::copy_file(from + "/" + f, live + "/" + f + ".tmp", fs::copy_options::overwrite_existing);
      fs::rename(live + "/" + f + ".tmp", live + "/" + f);
    }
  };
  install(dir + "/old");
  auto port = ::ddp::testing::ClaimPort();
  ASSERT_TRUE(port.ok());
  const std::string address = absl::StrCat("127.0.0.1:", *port);
  SpawnOptions o;
  o.argv = {BinDir() + "/ddp-coordinator", "--listen", address, "--state-dir", dir + "/state",
            "--tls-cert", live + "/coordinator.pem", "--tls-key", live + "/coordinator.key",
            "--auth-token-file", live + "/tokens"};
  auto coordinator = Subprocess::Spawn(o);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  auto list = [&](const std::string& ca, const std::string& token) {
    return RunCapture({BinDir() + "/ddpctl", "list", "--coordinator", address, "--tls-ca",
                       dir + "/" + ca + "/ca.pem", "--token-file",
                       dir + "/" + token + "/user.token"},
                      absl::Minutes(1));
  };
  auto eventually = [&](const std::string& ca, const std::string& token) {
    const absl::Time deadline = absl::Now() + absl::Minutes(1);
    CtlResult r;
    do {
      r = list(ca, token);
    } while (r.exit_code != 0 && absl::Now() < deadline);  // Each try takes a handshake.
    return r;
  };
  CtlResult before = eventually("old", "old");
  ASSERT_EQ(before.exit_code, 0) << before.err;

  install(dir + "/new");
  (*coordinator)->Signal(SIGHUP);  // The token file at once; certificates by their watcher.
  CtlResult after = eventually("new", "new");
  EXPECT_EQ(after.exit_code, 0) << after.err;
  CtlResult revoked = list("new", "old");
  EXPECT_EQ(revoked.exit_code, 1);
  EXPECT_THAT(revoked.err, HasSubstr("the token is not valid on this coordinator"));
  CtlResult old_ca = list("old", "new");
  EXPECT_EQ(old_ca.exit_code, 1);
  EXPECT_THAT(old_ca.err, HasSubstr("the TLS handshake with " + address + " failed"));
  EXPECT_TRUE((*coordinator)->TryWait() == std::nullopt) << "the same process all along";
  EXPECT_EQ((*coordinator)->Terminate(absl::Seconds(5)).exit_code, 0);
}

TEST(AllowedRootsTest, AJobWhosePathsEscapeTheRootsFailsBeforeAnyTrainerStarts) {
  namespace fs = std::filesystem;
  const std::string base = testing::MakeTempDir("roots");
  const std::string root = base + "/jobs";
  fs::create_directories(root + "/data");
  fs::copy_file(SourceDir() + "/data/breast_cancer.csv", base + "/outside.csv");
  fs::copy_file(SourceDir() + "/data/breast_cancer.csv", root + "/data/inside.csv");
  fs::create_symlink(base + "/outside.csv", root + "/data/link.csv");
  LocalCluster::Options o;
  o.worker_flags = {"--allow-root", root};
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  auto job = [&](const std::string& name, const std::string& csv) {
    const std::string path = absl::StrCat(root, "/", name, ".yaml");
    testing::WriteFile(path, absl::StrCat("name: ", name, R"(
nodes: 2
model: {mlp: {hidden: [8]}}
data: {csv: {path: )", csv, R"(, skip_rows: 1, label_column: -1}}
train: {epochs: 1, batch_size: 64}
)"));
    CtlResult r = (*cluster)->Ctl({"submit", path});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return std::string(absl::StripAsciiWhitespace(r.out));
  };
  struct Case {
    std::string name, csv, resolved;
  };
  const std::vector<Case> escapes = {
      {"dotdot", "../outside.csv", base + "/outside.csv"},
      {"absolute", "/etc/passwd", "/etc/passwd"},
      {"symlink", "data/link.csv", base + "/outside.csv"},
  };
  for (const Case& c : escapes) {
    const std::string id = job(c.name, c.csv);
    auto failed = (*cluster)->WaitFor(id, [](const v1::Job& j) { return j.state() == v1::FAILED; });
    ASSERT_TRUE(failed.ok()) << c.name << ": " << failed.status();
    EXPECT_THAT(failed->reason(),
                HasSubstr(absl::StrCat("data.csv.path: ", c.csv, " resolves to ", c.resolved,
                                       ", outside the directories this worker lets jobs use "
                                       "(--allow-root ",
                                       root, ")")))
        << c.name;
    EXPECT_EQ(failed->restarts(), 0) << "a permanent failure";
    for (const auto& a : failed->attempts()) {
      for (const auto& r : a.ranks()) EXPECT_EQ(r.pid(), 0) << c.name << ": no trainer started";
    }
  }
  // The job's fault, not the nodes': neither is quarantined.
  EXPECT_THAT((*cluster)->Ctl({"workers"}).out, Not(HasSubstr("quarantined")));
  // Inside the root it trains.
  const std::string ok = job("inside", "data/inside.csv");
  auto done = (*cluster)->WaitFor(ok, [](const v1::Job& j) { return j.state() == v1::SUCCEEDED; });
  EXPECT_TRUE(done.ok()) << done.status();
}

}  // namespace
}  // namespace ddp
