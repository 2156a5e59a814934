// The web dashboard's HTTP layer on a real loopback port (civetweb), over the real
// coordinator facade of the tests' harness (fake clock, in-memory store) and a real
// token file: the JSON's shapes (parsed back into the protos ddpctl gets), 404 for an
// unknown job, 401 without a token, 403 for a worker identity, viewer allowed, the
// browser login (?token= -> cookie -> redirect), escaping of hostile text, redaction
// of env values, read-only (405), the security headers, the open quickstart, and the
// --http-listen rule for non-loopback addresses.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "coordinator/http/assets.h"
#include "coordinator/http/dashboard_server.h"
#include "coordinator/server.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/coordinator/coordinator_harness.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kAdmin[] = "admin-token-0123456789";
constexpr char kAlice[] = "user-token-alice-0123456789";
constexpr char kViewer[] = "viewer-token-0123456789";
constexpr char kWorker[] = "worker-token-w1-0123456789";

constexpr char kSecretJob[] =
    "name: demo\nnodes: 2\nmodel: {mlp: {}}\ndata: {synthetic: {}}\ntrain: {batch_size: 4}\n"
    "env:\n  API_KEY: hunter2-secret\n";

struct Reply {
  int status = 0;
  std::map<std::string, std::string> headers;  // Lower-case names.
  std::string body;
};

// One HTTP/1.0 exchange with 127.0.0.1:`port` (the dashboard closes each connection).
Reply Request(int port, const std::string& target, const std::string& extra_headers = "",
              const std::string& method = "GET") {
  Reply reply;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return reply;
  }
  const std::string request = absl::StrCat(method, " ", target, " HTTP/1.0\r\nHost: 127.0.0.1\r\n",
                                           extra_headers, "\r\n");
  (void)!write(fd, request.data(), request.size());
  std::string raw;
  char buf[8192];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) raw.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) return reply;
  reply.body = raw.substr(end + 4);
  std::vector<std::string> lines = absl::StrSplit(raw.substr(0, end), "\r\n");
  std::vector<std::string> status = absl::StrSplit(lines[0], ' ');
  if (status.size() >= 2) reply.status = std::stoi(status[1]);
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    reply.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
  }
  return reply;
}

std::string Bearer(const std::string& token) {
  return absl::StrCat("Authorization: Bearer ", token, "\r\n");
}

google::protobuf::Struct ParseJson(const std::string& body) {
  google::protobuf::Struct s;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(body, &s).ok()) << body;
  return s;
}

// A JSON value parsed strictly (unknown fields refused) into the proto ddpctl gets.
template <typename Message>
Message AsProto(const google::protobuf::Value& value) {
  std::string json;
  EXPECT_TRUE(google::protobuf::util::MessageToJsonString(value, &json).ok());
  Message m;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &m).ok()) << json;
  return m;
}

class DashboardTest : public testing::CoordinatorHarness {
 protected:
  void SetUp() override {
    CoordinatorHarness::SetUp();
    tokens_ = dir_ + "/tokens";
    testing::WriteFile(tokens_, absl::StrCat(kAdmin, " admin\n", kAlice, " user alice\n",
                                             kViewer, " viewer\n", kWorker, " worker w1\n"));
    Serve(tokens_);
  }
  void TearDown() override {
    server_.reset();  // Before the coordinator it reads.
    CoordinatorHarness::TearDown();
  }

  // (Re)starts the dashboard; `token_file` "" authenticates no one.
  void Serve(const std::string& token_file) {
    server_.reset();
    auto auth = Authorizer::Create({token_file});
    ASSERT_TRUE(auth.ok()) << auth.status();
    auth_ = *std::move(auth);
    auto server = DashboardServer::Start(
        {"127.0.0.1:0"},
        std::make_unique<DashboardHandler>(coordinator_.get(), hub_.get(), auth_.get(), &clock_));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_GT(server_->port(), 0);
  }

  Reply Get(const std::string& target, const std::string& token = kViewer) {
    return Request(server_->port(), target, token.empty() ? "" : Bearer(token));
  }

  // Alice's job with a secret in its env, RUNNING on w1 (rank 0) and w2 (rank 1), each
  // rank at global step 7, and an output line.
  std::string RunningJob() {
    Register("w1");
    Register("w2");
    auto job = Submit(kSecretJob, Caller{"alice", false});
    EXPECT_TRUE(job.ok()) << job.status();
    const std::string id = job->id();
    const v1::Task t1 = Heartbeat("w1").at(0);
    const v1::Task t2 = Heartbeat("w2").at(0);
    Heartbeat("w1", {Running(t1)});
    Heartbeat("w2", {Running(t2)});
    for (const auto& [worker, task] : {std::pair{"w1", t1}, std::pair{"w2", t2}}) {
      v1::TrainerEvent e;
      e.mutable_step()->set_global_step(7);
      e.mutable_step()->set_loss(0.5 + task.ranks(0));
      e.mutable_step()->set_samples_per_s(800);
      EXPECT_TRUE(ReportEvents(worker, id, task.attempt(), task.ranks(0), {e}).ok());
    }
    EXPECT_TRUE(ReportLines("w1", id, {"epoch 0 done"}).ok());
    return id;
  }

  std::string tokens_;
  std::unique_ptr<Authorizer> auth_;
  std::unique_ptr<DashboardServer> server_;
};

TEST_F(DashboardTest, ApiAnswersWithTheProtosJsonForAViewer) {
  const std::string id = RunningJob();

  Reply jobs = Get("/api/jobs");
  ASSERT_EQ(jobs.status, 200) << jobs.body;
  EXPECT_EQ(jobs.headers["content-type"], "application/json; charset=utf-8");
  google::protobuf::Struct list = ParseJson(jobs.body);
  EXPECT_EQ(list.fields().at("now_ms").number_value(), absl::ToUnixMillis(clock_.Now()));
  ASSERT_EQ(list.fields().at("jobs").list_value().values_size(), 1);
  v1::Job listed = AsProto<v1::Job>(list.fields().at("jobs").list_value().values(0));
  EXPECT_EQ(listed.id(), id);
  EXPECT_EQ(listed.state(), v1::RUNNING);
  EXPECT_EQ(listed.owner(), "alice");
  // Field names as in the .proto (ddpctl get -o json), zeros included.
  EXPECT_THAT(jobs.body, HasSubstr("\"submit_ms\""));
  EXPECT_THAT(jobs.body, HasSubstr("\"priority\":0"));

  Reply one = Get("/api/jobs/" + id + "?history=1");
  ASSERT_EQ(one.status, 200) << one.body;
  v1::Job job = AsProto<v1::Job>(ParseJson(one.body).fields().at("job"));
  EXPECT_EQ(job.id(), id);
  ASSERT_EQ(job.attempts_size(), 1);
  EXPECT_EQ(job.attempts(0).ranks_size(), 2);
  ASSERT_EQ(job.metrics_size(), 2);
  std::map<int, double> loss;
  for (const v1::RankMetrics& m : job.metrics()) loss[m.rank()] = m.loss();
  EXPECT_EQ(loss, (std::map<int, double>{{0, 0.5}, {1, 1.5}}));
  EXPECT_EQ(job.history_size(), 2) << "history=1 adds the stored steps";
  Reply no_history = Get("/api/jobs/" + id);
  EXPECT_EQ(AsProto<v1::Job>(ParseJson(no_history.body).fields().at("job")).history_size(), 0);

  Reply logs = Get("/api/jobs/" + id + "/logs?tail=10");
  ASSERT_EQ(logs.status, 200) << logs.body;
  const google::protobuf::Struct parsed = ParseJson(logs.body);
  const auto& lines = parsed.fields().at("lines").list_value();
  ASSERT_EQ(lines.values_size(), 1);
  EXPECT_EQ(AsProto<v1::LogLine>(lines.values(0)).text(), "epoch 0 done");
  EXPECT_EQ(Get("/api/jobs/" + id + "/logs?tail=0").status, 400);

  Reply workers = Get("/api/workers");
  ASSERT_EQ(workers.status, 200) << workers.body;
  google::protobuf::Struct w = ParseJson(workers.body);
  ASSERT_EQ(w.fields().at("workers").list_value().values_size(), 2);
  EXPECT_EQ(AsProto<v1::Worker>(w.fields().at("workers").list_value().values(0)).name(), "w1");
  EXPECT_EQ(AsProto<v1::WorkerSummary>(w.fields().at("summary")).alive(), 2);

  // The pages: static HTML (the data comes through the API), for the viewer too.
  Reply index = Get("/");
  ASSERT_EQ(index.status, 200);
  EXPECT_EQ(index.headers["content-type"], "text/html; charset=utf-8");
  EXPECT_THAT(index.body, HasSubstr("<table id=\"jobs\">"));
  Reply page = Get("/jobs/" + id);
  ASSERT_EQ(page.status, 200);
  EXPECT_THAT(page.body, HasSubstr("<table id=\"ranks\">"));
  EXPECT_EQ(Request(server_->port(), "/static/dashboard.js").status, 200) << "no token needed";
}

TEST_F(DashboardTest, UnknownJobIs404WithAMessage) {
  for (const char* target : {"/api/jobs/nope", "/api/jobs/nope/logs", "/jobs/nope"}) {
    Reply r = Get(target);
    EXPECT_EQ(r.status, 404) << target;
    EXPECT_THAT(r.body, HasSubstr("not found: the jobs page (/) lists the jobs")) << target;
  }
  EXPECT_EQ(ParseJson(Get("/api/jobs/nope").body).fields().at("error").string_value(),
            "job 'nope' not found: the jobs page (/) lists the jobs the coordinator knows");
  EXPECT_EQ(Get("/nothing/here").status, 404);
}

TEST_F(DashboardTest, RefusesNoTokenAndWorkersAndAdmitsReaders) {
  const std::string id = RunningJob();
  const std::vector<std::string> targets = {"/",         "/jobs/" + id,
                                            "/api/jobs", "/api/jobs/" + id,
                                            "/api/jobs/" + id + "/logs", "/api/workers"};
  for (const std::string& target : targets) {
    Reply none = Get(target, "");
    EXPECT_EQ(none.status, 401) << target;
    EXPECT_EQ(none.headers["www-authenticate"], "Bearer realm=\"ddp\"") << target;
    EXPECT_THAT(none.body, HasSubstr("/?token=TOKEN")) << target;
    EXPECT_THAT(none.body, HasSubstr("Authorization: Bearer TOKEN")) << target;
    Reply wrong = Get(target, "not-a-token-0123456789");
    EXPECT_EQ(wrong.status, 401) << target;
    EXPECT_THAT(wrong.body, HasSubstr("not valid on this coordinator")) << target;
    Reply worker = Get(target, kWorker);
    EXPECT_EQ(worker.status, 403) << target;
    EXPECT_THAT(worker.body, HasSubstr("w1 (role worker) may not call")) << target;
    for (const char* reader : {kViewer, kAlice, kAdmin}) {
      EXPECT_EQ(Get(target, reader).status, 200) << target << " as " << reader;
    }
  }
}

TEST_F(DashboardTest, TokenInTheAddressBecomesAStrictHttpOnlyCookie) {
  const std::string id = RunningJob();
  Reply login = Get("/jobs/" + id + "?token=" + kViewer + "&x=1", "");
  ASSERT_EQ(login.status, 303) << login.body;
  EXPECT_EQ(login.headers["location"], "/jobs/" + id + "?x=1");
  EXPECT_EQ(login.headers["set-cookie"],
            absl::StrCat("ddp_token=", kViewer, "; Path=/; HttpOnly; SameSite=Strict"));
  // The cookie then stands for the token.
  Reply with_cookie =
      Request(server_->port(), "/api/jobs/" + id, absl::StrCat("Cookie: a=b; ddp_token=", kViewer, "\r\n"));
  EXPECT_EQ(with_cookie.status, 200) << with_cookie.body;
  // A bad token sets nothing; a worker's is refused.
  Reply bad = Get("/?token=not-a-token-0123456789", "");
  EXPECT_EQ(bad.status, 401);
  EXPECT_EQ(bad.headers.count("set-cookie"), 0u);
  EXPECT_EQ(Get(std::string("/?token=") + kWorker, "").status, 403);
}

TEST_F(DashboardTest, HostileTextStaysText) {
  // A job id in the address comes back escaped in the HTML error page.
  Reply page = Get("/jobs/%3Cscript%3Ealert(1)%3C%2Fscript%3E");
  EXPECT_EQ(page.status, 404);
  EXPECT_THAT(page.body, HasSubstr("&lt;script&gt;alert(1)&lt;/script&gt;"));
  EXPECT_THAT(page.body, Not(HasSubstr("<script>alert")));
  // A trainer's output line with markup: JSON text, which parses back to itself.
  const std::string id = RunningJob();
  const std::string hostile = "</script><img src=x onerror=alert(1)> \"quoted\" \x1b[31m";
  ASSERT_TRUE(ReportLines("w1", id, {hostile}).ok());
  Reply logs = Get("/api/jobs/" + id + "/logs");
  ASSERT_EQ(logs.status, 200);
  EXPECT_EQ(logs.headers["x-content-type-options"], "nosniff");
  const google::protobuf::Struct parsed = ParseJson(logs.body);
  const auto& lines = parsed.fields().at("lines").list_value();
  ASSERT_EQ(lines.values_size(), 2);
  EXPECT_EQ(AsProto<v1::LogLine>(lines.values(1)).text(), hostile);
  // The pages' script builds the DOM from text only: nothing parses data as HTML.
  const EmbeddedAsset* js = FindAsset("dashboard.js");
  ASSERT_NE(js, nullptr);
  const std::string code(js->bytes);
  for (const char* sink : {"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write",
                           "eval(", "new Function"}) {
    EXPECT_THAT(code, Not(HasSubstr(sink)));
  }
  EXPECT_THAT(code, HasSubstr("textContent"));
}

TEST_F(DashboardTest, EnvValuesAreRedactedForReadersWhoDoNotOwnTheJob) {
  const std::string id = RunningJob();
  auto spec_as = [&](const char* token) {
    Reply r = Get("/api/jobs/" + id, token);
    EXPECT_EQ(r.status, 200) << r.body;
    return AsProto<v1::Job>(ParseJson(r.body).fields().at("job")).spec_yaml();
  };
  EXPECT_THAT(spec_as(kViewer), Not(HasSubstr("hunter2-secret")));
  EXPECT_THAT(spec_as(kViewer), HasSubstr("API_KEY: <redacted>"));
  EXPECT_THAT(spec_as(kAlice), HasSubstr("hunter2-secret")) << "the owner sees her own";
  EXPECT_THAT(spec_as(kAdmin), HasSubstr("hunter2-secret"));
  // The list never carries specs.
  EXPECT_THAT(Get("/api/jobs", kViewer).body, Not(HasSubstr("hunter2-secret")));
}

TEST_F(DashboardTest, ReadOnlyWithSecurityHeadersOnEveryAnswer) {
  for (const char* method : {"POST", "PUT", "DELETE", "PATCH"}) {
    Reply r = Request(server_->port(), "/api/jobs", Bearer(kAdmin), method);
    EXPECT_EQ(r.status, 405) << method;
    EXPECT_EQ(r.headers["allow"], "GET, HEAD");
    EXPECT_THAT(r.body, HasSubstr("read-only"));
  }
  Reply head = Request(server_->port(), "/api/jobs", Bearer(kViewer), "HEAD");
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.body, "");
  EXPECT_NE(head.headers["content-length"], "0");
  for (const char* target : {"/", "/api/jobs", "/static/dashboard.css", "/nope"}) {
    for (const char* token : {kViewer, ""}) {
      Reply r = Get(target, token);
      EXPECT_EQ(r.headers["content-security-policy"], "default-src 'self'; frame-ancestors 'none'")
          << target;
      EXPECT_EQ(r.headers["x-content-type-options"], "nosniff") << target;
    }
  }
}

TEST_F(DashboardTest, OpenWhenTheCoordinatorAuthenticatesNoOne) {
  Serve("");
  const std::string id = RunningJob();
  EXPECT_EQ(Get("/", "").status, 200);
  EXPECT_EQ(Get("/api/jobs/" + id, "").status, 200);
  // Open: everyone is trusted as on the gRPC port, so env values are shown.
  EXPECT_THAT(Get("/api/jobs/" + id, "").body, HasSubstr("hunter2-secret"));
  // A token in the address is dropped from it; no cookie is needed.
  Reply login = Get(std::string("/?token=") + kViewer, "");
  EXPECT_EQ(login.status, 303);
  EXPECT_EQ(login.headers["location"], "/");
  EXPECT_EQ(login.headers.count("set-cookie"), 0u);
}

TEST(DashboardOptionsTest, NonLoopbackNeedsInsecure) {
  CoordinatorServerOptions o;
  o.state_dir = "/tmp/unused";
  for (const char* loopback : {"127.0.0.1:0", "localhost:8080", "[::1]:8080"}) {
    o.http_listen = loopback;
    EXPECT_TRUE(ValidateServerOptions(o).ok()) << loopback;
  }
  // Plain HTTP even where the gRPC port has TLS and tokens.
  o.tls.cert_file = "c.pem";
  o.tls.key_file = "c.key";
  o.auth.token_file = "/tmp/tokens";
  o.http_listen = "0.0.0.0:8080";
  absl::Status st = ValidateServerOptions(o);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("--http-listen 0.0.0.0:8080 is reachable from other machines, but the "
                        "dashboard serves plain HTTP"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("pass --insecure"));
  o.insecure = true;
  EXPECT_TRUE(ValidateServerOptions(o).ok());
  o.http_listen = "nonsense";
  EXPECT_THAT(std::string(ValidateServerOptions(o).message()), HasSubstr("--http-listen"));
}

}  // namespace
}  // namespace ddp
