// The web dashboard's HTTP layer on a real loopback port (Beast on Asio, plain HTTP and
// HTTPS with certificates from scripts/make_certs.sh, verified against its CA), over
// the real coordinator facade of the tests' harness (fake clock, in-memory store) and a
// real token file: the JSON's shapes (parsed back into the protos ddpctl gets), 404 for
// an unknown job, 401 without a token, 403 for a worker identity, viewer allowed, the
// login form (cookie, Secure over HTTPS, wrong token 401, no open redirect), a token in
// the address never taken nor echoed, POST only on /login and /logout and only from
// this origin, escaping of hostile text, redaction of env values, the security
// headers, the open quickstart, certificates re-read when replaced, slow clients
// (many connections dripping headers) not starving a normal request and closed by the
// header deadline, the connection cap, and the --http-listen rule.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
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
  std::string raw;  // Everything that came back.
};

// One client connection to 127.0.0.1:`port`: plain TCP, or TLS verifying the server's
// certificate for 127.0.0.1 against `ca`.
class Conn {
 public:
  // Null when the connection or the TLS handshake fails.
  static std::unique_ptr<Conn> Open(int port, const std::string& ca = "") {
    std::unique_ptr<Conn> c(new Conn());
    c->fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(c->fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return nullptr;
    if (ca.empty()) return c;
    c->ctx_ = SSL_CTX_new(TLS_client_method());
    if (SSL_CTX_load_verify_locations(c->ctx_, ca.c_str(), nullptr) != 1) return nullptr;
    SSL_CTX_set_verify(c->ctx_, SSL_VERIFY_PEER, nullptr);
    c->ssl_ = SSL_new(c->ctx_);
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl_), "127.0.0.1");
    SSL_set_fd(c->ssl_, c->fd_);
    if (SSL_connect(c->ssl_) != 1) return nullptr;
    return c;
  }
  ~Conn() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (ctx_ != nullptr) SSL_CTX_free(ctx_);
    if (fd_ >= 0) close(fd_);
  }
  bool Send(const std::string& data) {
    if (ssl_ != nullptr) return SSL_write(ssl_, data.data(), static_cast<int>(data.size())) > 0;
    return send(fd_, data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
  }
  // Bytes read, 0 at the end, < 0 on an error.
  ssize_t Read(char* buf, size_t size) {
    if (ssl_ != nullptr) return SSL_read(ssl_, buf, static_cast<int>(size));
    return read(fd_, buf, size);
  }
  std::string ReadAll() {
    std::string raw;
    char buf[8192];
    ssize_t n;
    while ((n = Read(buf, sizeof(buf))) > 0) raw.append(buf, static_cast<size_t>(n));
    return raw;
  }
  // Whether the server closed the connection (or reset it) within `wait`.
  // Reads past whatever comes first (a TLS server's session tickets, say).
  bool ClosedWithin(absl::Duration wait) {
    const absl::Time deadline = absl::Now() + wait;
    for (absl::Time now = absl::Now(); now < deadline; now = absl::Now()) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(deadline - now)) + 1) <= 0) {
        continue;
      }
      char buf[4096];
      const ssize_t n = recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
    }
    return false;
  }
  int fd() const { return fd_; }

 private:
  Conn() = default;
  int fd_ = -1;
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
};

Reply Parse(const std::string& raw) {
  Reply reply;
  reply.raw = raw;
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) return reply;
  reply.body = raw.substr(end + 4);
  std::vector<std::string> lines = absl::StrSplit(raw.substr(0, end), "\r\n");
  std::vector<std::string> status = absl::StrSplit(lines[0], ' ');
  if (status.size() >= 2) reply.status = std::stoi(status[1]);
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    std::string& value = reply.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))];
    if (!value.empty()) value += "\n";  // Repeated headers (Set-Cookie), one a line.
    value += std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
  }
  return reply;
}

// One HTTP/1.0 exchange with 127.0.0.1:`port` (HTTPS verified against `ca` when
// given); the dashboard closes the connection after answering it.
Reply Request(int port, const std::string& target, const std::string& extra_headers = "",
              const std::string& method = "GET", const std::string& body = "",
              const std::string& ca = "") {
  std::unique_ptr<Conn> conn = Conn::Open(port, ca);
  if (conn == nullptr) return {};
  const std::string request = absl::StrCat(
      method, " ", target, " HTTP/1.0\r\nHost: 127.0.0.1:", port, "\r\n", extra_headers,
      body.empty() ? "" : absl::StrCat("Content-Length: ", body.size(), "\r\n"), "\r\n", body);
  if (!conn->Send(request)) return {};
  return Parse(conn->ReadAll());
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
    // Writing to a connection the server closed must fail, not kill the test.
    std::signal(SIGPIPE, SIG_IGN);
    tokens_ = dir_ + "/tokens";
    testing::WriteFile(tokens_, absl::StrCat(kAdmin, " admin\n", kAlice, " user alice\n",
                                             kViewer, " viewer\n", kWorker, " worker w1\n"));
    Serve(tokens_);
  }
  void TearDown() override {
    server_.reset();  // Before the coordinator it reads.
    CoordinatorHarness::TearDown();
  }

  // (Re)starts the dashboard; `token_file` "" authenticates no one. `options`' listen
  // defaults to a free loopback port; with a certificate, requests go over HTTPS
  // verified against `ca`.
  void Serve(const std::string& token_file, DashboardServerOptions options = {},
             const std::string& ca = "") {
    server_.reset();
    auto auth = Authorizer::Create({token_file});
    ASSERT_TRUE(auth.ok()) << auth.status();
    auth_ = *std::move(auth);
    if (options.listen.empty()) options.listen = "127.0.0.1:0";
    auto server = DashboardServer::Start(
        options,
        std::make_unique<DashboardHandler>(coordinator_.get(), hub_.get(), auth_.get(), &clock_));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_GT(server_->port(), 0);
    ca_ = ca;
  }

  // scripts/make_certs.sh into dir_/NAME (a CA, the coordinator's certificate for
  // 127.0.0.1, tokens).
  std::string MakeCerts(const std::string& name) {
    const std::string certs = dir_ + "/" + name;
    EXPECT_EQ(std::system(("/bin/bash " DDP_SOURCE_DIR "/scripts/make_certs.sh " + certs +
                           " >/dev/null 2>&1")
                              .c_str()),
              0);
    return certs;
  }

  Reply Get(const std::string& target, const std::string& token = kViewer) {
    return Request(server_->port(), target, token.empty() ? "" : Bearer(token), "GET", "", ca_);
  }

  // This server's own origin, as a browser on its pages sends it.
  std::string Origin() const {
    return absl::StrCat(ca_.empty() ? "http" : "https", "://127.0.0.1:", server_->port());
  }

  // A login form's post; `headers` "" sends this origin's Origin.
  Reply PostLogin(const std::string& form, const std::string& headers = "") {
    return Request(server_->port(), "/login",
                   absl::StrCat(headers.empty() ? absl::StrCat("Origin: ", Origin(), "\r\n")
                                                : headers,
                                "Content-Type: application/x-www-form-urlencoded\r\n"),
                   "POST", form, ca_);
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
  std::string ca_;  // "": plain HTTP.
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
    EXPECT_THAT(none.body, HasSubstr("log in at /login")) << target;
    EXPECT_THAT(none.body, HasSubstr("Authorization: Bearer TOKEN")) << target;
    if (!absl::StartsWith(target, "/api/")) {
      // A page links to the form, which comes back here.
      EXPECT_THAT(none.body, HasSubstr(absl::StrCat("<a href=\"/login?next=",
                                                    absl::StrReplaceAll(target, {{"/", "%2F"}}),
                                                    "\">Log in</a>")))
          << target;
    }
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

TEST_F(DashboardTest, LoginFormSetsAStrictHttpOnlyCookie) {
  const std::string id = RunningJob();
  Reply form = Get("/login?next=%2Fjobs%2F" + id, "");
  ASSERT_EQ(form.status, 200) << form.body;
  EXPECT_EQ(form.headers["content-type"], "text/html; charset=utf-8");
  EXPECT_THAT(form.body, HasSubstr("<form class=\"login\" method=\"post\" action=\"/login\">"));
  EXPECT_THAT(form.body, HasSubstr("name=\"next\" value=\"/jobs/" + id + "\""));
  EXPECT_THAT(form.body, HasSubstr("name=\"token\" type=\"password\""));
  EXPECT_THAT(form.body, Not(HasSubstr("<script")));
  EXPECT_EQ(form.headers["content-security-policy"], "default-src 'self'; frame-ancestors 'none'");

  Reply login = PostLogin(absl::StrCat("token=", kViewer, "&next=%2Fjobs%2F", id));
  ASSERT_EQ(login.status, 303) << login.body;
  EXPECT_EQ(login.headers["location"], "/jobs/" + id);
  // Plain HTTP (loopback): not Secure, which a browser would refuse to send back here.
  EXPECT_EQ(login.headers["set-cookie"],
            absl::StrCat("ddp_token=", kViewer, "; Path=/; HttpOnly; SameSite=Strict"));
  // The cookie then stands for the token.
  Reply with_cookie = Request(server_->port(), "/api/jobs/" + id,
                              absl::StrCat("Cookie: a=b; ddp_token=", kViewer, "\r\n"));
  EXPECT_EQ(with_cookie.status, 200) << with_cookie.body;

  // A wrong token: the form again, with why, and no cookie; a worker's is refused.
  Reply bad = PostLogin("token=not-a-token-0123456789&next=%2F");
  EXPECT_EQ(bad.status, 401);
  EXPECT_EQ(bad.headers.count("set-cookie"), 0u);
  EXPECT_THAT(bad.body, HasSubstr("not valid on this coordinator"));
  EXPECT_THAT(bad.body, HasSubstr("action=\"/login\""));
  EXPECT_THAT(bad.body, Not(HasSubstr("not-a-token-0123456789")));
  Reply worker = PostLogin(absl::StrCat("token=", kWorker));
  EXPECT_EQ(worker.status, 403);
  EXPECT_EQ(worker.headers.count("set-cookie"), 0u);
  EXPECT_EQ(PostLogin("token=&next=%2F").status, 401);

  // Only a path of this site: no open redirect, no query carried back.
  for (const auto& [next, location] : std::vector<std::pair<std::string, std::string>>{
           {"%2F%2Fevil.example%2Fx", "/"},
           {"https%3A%2F%2Fevil.example%2F", "/"},
           {"%2F%5Cevil.example", "/"},
           {"%2Fjobs%2Fx%3Ftoken%3Dabc", "/jobs/x"},
           {"%2F%0D%0ASet-Cookie%3A%20x%3Dy", "/"}}) {
    Reply r = PostLogin(absl::StrCat("token=", kViewer, "&next=", next));
    EXPECT_EQ(r.status, 303) << next;
    EXPECT_EQ(r.headers["location"], location) << next;
  }

  // Logging out clears the cookie.
  Reply out = Request(server_->port(), "/logout",
                      absl::StrCat("Origin: ", Origin(), "\r\nCookie: ddp_token=", kViewer, "\r\n"),
                      "POST");
  EXPECT_EQ(out.status, 303);
  EXPECT_EQ(out.headers["location"], "/login");
  EXPECT_EQ(out.headers["set-cookie"], "ddp_token=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict");
}

TEST_F(DashboardTest, TokenInTheAddressIsNeitherTakenNorEchoed) {
  const std::string id = RunningJob();
  for (const std::string& target :
       {absl::StrCat("/?token=", kViewer), absl::StrCat("/jobs/", id, "?x=1&%74oken=", kViewer),
        absl::StrCat("/api/jobs?TOKEN=", kViewer),
        absl::StrCat("/api/jobs?%54%4F%4B%45%4E=", kViewer),
        absl::StrCat("/login?next=%2F&Token=", kViewer), absl::StrCat("/?tok%65n=", kViewer),
        absl::StrCat("/nothing?token+=", kViewer)}) {
    for (const char* method : {"GET", "HEAD", "POST"}) {
      Reply r = Request(server_->port(), target, "", method);
      EXPECT_EQ(r.status, 303) << method << " " << target;
      const std::string path = target.substr(0, target.find('?'));
      EXPECT_EQ(r.headers["location"], path) << target;
      EXPECT_THAT(r.raw, Not(HasSubstr(kViewer))) << target;
      EXPECT_EQ(r.headers.count("set-cookie"), 0u) << target;
    }
  }
  // The bare name too, and a token in the address admits no one.
  EXPECT_EQ(Get("/api/jobs?token", "").headers["location"], "/api/jobs");
  EXPECT_NE(Get(absl::StrCat("/api/jobs?token=", kViewer), "").status, 200);
  // Other parameters are served as before.
  EXPECT_EQ(Get("/api/jobs?limit=5").status, 200);
}

TEST_F(DashboardTest, PostOnlyOnLoginAndLogoutFromThisOrigin) {
  for (const char* method : {"POST", "PUT", "DELETE", "PATCH"}) {
    Reply r = Request(server_->port(), "/api/jobs", Bearer(kAdmin), method);
    EXPECT_EQ(r.status, 405) << method;
    EXPECT_EQ(r.headers["allow"], "GET, HEAD");
    EXPECT_THAT(r.body, HasSubstr("read-only"));
  }
  for (const char* target : {"/", "/jobs/x", "/static/dashboard.css"}) {
    Reply r = Request(server_->port(), target,
                      absl::StrCat("Origin: ", Origin(), "\r\n", Bearer(kAdmin)), "POST");
    EXPECT_EQ(r.status, 405) << target;
  }
  EXPECT_EQ(Request(server_->port(), "/login", "", "PUT").headers["allow"], "GET, HEAD, POST");
  EXPECT_EQ(Get("/logout").status, 405);

  const std::string form = absl::StrCat("token=", kViewer);
  // Another site's form, a sandboxed one ("null"), or no origin at all: refused.
  for (const std::string& headers :
       {std::string("Origin: http://evil.example\r\n"), std::string("Origin: null\r\n"),
        absl::StrCat("Origin: http://127.0.0.1:", server_->port() + 1, "\r\n"),
        absl::StrCat("Origin: https://127.0.0.1:", server_->port(), "\r\n"),
        std::string("Referer: http://evil.example/login\r\n"),
        absl::StrCat("Referer: http://127.0.0.1:", server_->port(), ".evil.example/\r\n"),
        std::string("X-Nothing: 1\r\n")}) {
    Reply r = PostLogin(form, headers);
    EXPECT_EQ(r.status, 403) << headers;
    EXPECT_EQ(r.headers.count("set-cookie"), 0u) << headers;
    EXPECT_THAT(r.body, HasSubstr("own form (its Origin or Referer is not this site)")) << headers;
    Reply out = Request(server_->port(), "/logout", headers, "POST");
    EXPECT_EQ(out.status, 403) << headers;
  }
  // A browser that sends only a Referer of this site is one of ours.
  EXPECT_EQ(PostLogin(form, absl::StrCat("Referer: ", Origin(), "/login?next=%2F\r\n")).status,
            303);
  // A login is a form: anything else, or a body past the limit, is refused.
  Reply json = Request(server_->port(), "/login",
                       absl::StrCat("Origin: ", Origin(), "\r\nContent-Type: application/json\r\n"),
                       "POST", "{\"token\": \"x\"}");
  EXPECT_EQ(json.status, 400);
  Reply big = PostLogin(absl::StrCat("token=", std::string(5000, 'a')));
  EXPECT_EQ(big.status, 413);
  EXPECT_EQ(big.headers.count("set-cookie"), 0u);
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

TEST_F(DashboardTest, SecurityHeadersOnEveryAnswer) {
  Reply head = Request(server_->port(), "/api/jobs", Bearer(kViewer), "HEAD");
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.body, "");
  EXPECT_NE(head.headers["content-length"], "0");
  for (const char* target : {"/", "/api/jobs", "/static/dashboard.css", "/nope", "/login"}) {
    for (const char* token : {kViewer, ""}) {
      Reply r = Get(target, token);
      EXPECT_EQ(r.headers["content-security-policy"], "default-src 'self'; frame-ancestors 'none'")
          << target;
      EXPECT_EQ(r.headers["x-content-type-options"], "nosniff") << target;
      EXPECT_EQ(r.headers["cache-control"], "no-store") << target;
      // Not no-referrer: browsers then post forms with `Origin: null` (refused).
      EXPECT_EQ(r.headers["referrer-policy"], "same-origin") << target;
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
  // A token in the address is dropped from it; a login needs no cookie.
  Reply address = Get(std::string("/?token=") + kViewer, "");
  EXPECT_EQ(address.status, 303);
  EXPECT_EQ(address.headers["location"], "/");
  Reply login = PostLogin(absl::StrCat("token=", kViewer, "&next=%2Fjobs%2F", id));
  EXPECT_EQ(login.status, 303);
  EXPECT_EQ(login.headers["location"], "/jobs/" + id);
  EXPECT_EQ(login.headers.count("set-cookie"), 0u);
}

TEST_F(DashboardTest, ServesHttpsWithTheCoordinatorsCertificate) {
  const std::string certs = MakeCerts("certs");
  DashboardServerOptions o;
  o.cert_file = certs + "/coordinator.pem";
  o.key_file = certs + "/coordinator.key";
  o.header_timeout = absl::Seconds(2);
  Serve(tokens_, o, certs + "/ca.pem");
  ASSERT_TRUE(server_->https());
  const std::string id = RunningJob();

  // Verified against the CA, for 127.0.0.1 (Conn fails the handshake otherwise).
  Reply page = Get("/jobs/" + id);
  EXPECT_EQ(page.status, 200) << page.raw;
  EXPECT_THAT(page.body, HasSubstr("<table id=\"ranks\">"));
  EXPECT_EQ(Get("/api/jobs").status, 200);
  EXPECT_EQ(Get("/api/jobs", "").status, 401);
  // The cookie is Secure over HTTPS.
  Reply login = PostLogin(absl::StrCat("token=", kViewer, "&next=%2F"));
  ASSERT_EQ(login.status, 303) << login.raw;
  EXPECT_EQ(login.headers["set-cookie"],
            absl::StrCat("ddp_token=", kViewer, "; Path=/; HttpOnly; SameSite=Strict; Secure"));
  // And an http:// origin is not this one.
  EXPECT_EQ(PostLogin(absl::StrCat("token=", kViewer),
                      absl::StrCat("Origin: http://127.0.0.1:", server_->port(), "\r\n"))
                .status,
            403);

  // Nothing in plain text, and no trust from another CA.
  Reply plain = Request(server_->port(), "/api/jobs", Bearer(kViewer));
  EXPECT_EQ(plain.status, 0) << plain.raw;
  EXPECT_THAT(plain.raw, Not(HasSubstr("jobs")));
  const std::string other = MakeCerts("other");
  EXPECT_EQ(Conn::Open(server_->port(), other + "/ca.pem"), nullptr);

  // A connection that never starts its handshake is closed at the header deadline.
  std::unique_ptr<Conn> silent = Conn::Open(server_->port());
  ASSERT_NE(silent, nullptr);
  EXPECT_TRUE(silent->ClosedWithin(absl::Seconds(30)));
}

TEST_F(DashboardTest, HttpsPicksUpReplacedCertificateFiles) {
  const std::string certs = MakeCerts("certs");
  DashboardServerOptions o;
  o.cert_file = certs + "/coordinator.pem";
  o.key_file = certs + "/coordinator.key";
  o.tls_refresh = absl::Milliseconds(100);
  Serve(tokens_, o, certs + "/ca.pem");
  ASSERT_EQ(Get("/api/jobs").status, 200);

  // A new CA's certificate, renamed over the old files as make_certs.sh writes them.
  const std::string other = MakeCerts("other");
  for (const char* name : {"coordinator.key", "coordinator.pem"}) {
    std::filesystem::copy_file(other + "/" + name, certs + "/" + name + ".new");
    std::filesystem::rename(certs + "/" + name + ".new", certs + "/" + name);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  std::unique_ptr<Conn> conn;
  while (conn == nullptr && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
    conn = Conn::Open(server_->port(), other + "/ca.pem");
  }
  ASSERT_NE(conn, nullptr) << "still serving the old certificate";
  EXPECT_EQ(Conn::Open(server_->port(), certs + "/ca.pem"), nullptr);
  ca_ = other + "/ca.pem";
  EXPECT_EQ(Get("/api/jobs").status, 200);
}

// Many clients dripping a request header a byte at a time (the slowloris attack that
// held every thread of the old server): a normal request is still answered within a
// second, and the drippers are closed when the header deadline passes.
class SlowClientTest : public DashboardTest, public ::testing::WithParamInterface<bool> {};

TEST_P(SlowClientTest, DrippingHeadersDoNotStarveANormalRequest) {
  const bool https = GetParam();
  constexpr int kDrippers = 48;
  const absl::Duration header_timeout = absl::Seconds(6);
  DashboardServerOptions o;
  o.header_timeout = header_timeout;
  std::string ca;
  if (https) {
    const std::string certs = MakeCerts("certs");
    o.cert_file = certs + "/coordinator.pem";
    o.key_file = certs + "/coordinator.key";
    ca = certs + "/ca.pem";
  }
  Serve(tokens_, o, ca);
  RunningJob();

  std::vector<std::unique_ptr<Conn>> drippers;
  const absl::Time connected = absl::Now();
  for (int i = 0; i < kDrippers; ++i) {
    drippers.push_back(Conn::Open(server_->port(), ca));
    ASSERT_NE(drippers.back(), nullptr) << i;
    ASSERT_TRUE(drippers.back()->Send("GET /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "));
  }
  // A byte from each every 500 ms, until the server closes them (a write then fails).
  std::atomic<bool> stop{false};
  std::thread drip([&] {
    while (!stop.load()) {
      for (auto& d : drippers) (void)d->Send("x");
      absl::SleepFor(absl::Milliseconds(500));
    }
  });
  const absl::Time wait_until = absl::Now() + absl::Seconds(5);
  while (server_->connections() < kDrippers && absl::Now() < wait_until) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_GE(server_->connections(), kDrippers) << "the drippers are held open, not refused";

  absl::Duration slowest;
  for (int i = 0; i < 5; ++i) {
    const absl::Time start = absl::Now();
    Reply r = Get("/api/jobs");
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(r.status, 200) << r.raw;
    slowest = std::max(slowest, took);
  }
  std::cerr << "slowest normal request among " << kDrippers << " dripping "
            << (https ? "HTTPS" : "HTTP") << " connections: " << slowest << "\n";
  EXPECT_LT(slowest, absl::Seconds(1));

  // Each dripper is closed by the deadline (not before it: they were sending).
  int closed = 0;
  absl::Duration held;  // Until the first was closed.
  for (auto& d : drippers) {
    if (d->ClosedWithin(header_timeout + absl::Seconds(20))) ++closed;
    if (closed == 1 && held == absl::ZeroDuration()) held = absl::Now() - connected;
  }
  stop = true;
  drip.join();
  EXPECT_EQ(closed, kDrippers);
  EXPECT_GE(held, header_timeout - absl::Milliseconds(100));
  drippers.clear();
  const absl::Time drained = absl::Now() + absl::Seconds(10);
  while (server_->connections() > 0 && absl::Now() < drained) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(server_->connections(), 0);
}

INSTANTIATE_TEST_SUITE_P(HttpAndHttps, SlowClientTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Https" : "Http"; });

// One HTTP/1.1 answer from a kept-alive connection (its Content-Length tells the end).
Reply ReadOneAnswer(Conn& conn) {
  std::string raw;
  char buf[4096];
  size_t end = std::string::npos;
  while ((end = raw.find("\r\n\r\n")) == std::string::npos) {
    const ssize_t n = conn.Read(buf, sizeof(buf));
    if (n <= 0) return Parse(raw);
    raw.append(buf, static_cast<size_t>(n));
  }
  Reply head = Parse(raw);
  const size_t want = end + 4 + std::stoul(head.headers["content-length"]);
  while (raw.size() < want) {
    const ssize_t n = conn.Read(buf, sizeof(buf));
    if (n <= 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  return Parse(raw);
}

TEST_F(DashboardTest, KeptAliveConnectionsCloseWhenIdleOrSlow) {
  DashboardServerOptions o;
  o.idle_timeout = absl::Seconds(1);
  o.header_timeout = absl::Seconds(2);
  Serve(tokens_, o);
  const std::string request = absl::StrCat("GET /api/jobs HTTP/1.1\r\nHost: 127.0.0.1:",
                                           server_->port(), "\r\n", Bearer(kViewer), "\r\n");
  // Two requests on one connection, then silence: closed after the idle timeout.
  std::unique_ptr<Conn> idle = Conn::Open(server_->port());
  ASSERT_NE(idle, nullptr);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(idle->Send(request));
    Reply r = ReadOneAnswer(*idle);
    EXPECT_EQ(r.status, 200) << i << ": " << r.raw;
    EXPECT_THAT(r.body, HasSubstr("\"jobs\"")) << i;
  }
  absl::Time since = absl::Now();
  EXPECT_TRUE(idle->ClosedWithin(absl::Seconds(20)));
  EXPECT_GE(absl::Now() - since, absl::Milliseconds(900));

  // A next request that starts but drips: closed at the header deadline.
  std::unique_ptr<Conn> slow = Conn::Open(server_->port());
  ASSERT_NE(slow, nullptr);
  ASSERT_TRUE(slow->Send(request));
  EXPECT_EQ(ReadOneAnswer(*slow).status, 200);
  since = absl::Now();
  ASSERT_TRUE(slow->Send("GET /api/jobs HTTP/1.1\r\nX-Slow: "));
  bool closed = false;
  while (!closed && absl::Now() - since < absl::Seconds(20)) {
    (void)slow->Send("x");
    closed = slow->ClosedWithin(absl::Milliseconds(300));
  }
  EXPECT_TRUE(closed);
  EXPECT_GE(absl::Now() - since, absl::Milliseconds(1900));
}

TEST_F(DashboardTest, ConnectionsPastTheCapAreClosedAtOnce) {
  DashboardServerOptions o;
  o.max_connections = 4;
  Serve(tokens_, o);
  std::vector<std::unique_ptr<Conn>> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(Conn::Open(server_->port()));
  const absl::Time wait_until = absl::Now() + absl::Seconds(10);
  while (server_->connections() < 4 && absl::Now() < wait_until) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(server_->connections(), 4);
  // The fifth is accepted by the kernel, then closed without an answer.
  Reply refused = Get("/api/jobs");
  EXPECT_EQ(refused.status, 0) << refused.raw;
  EXPECT_EQ(refused.raw, "");
  EXPECT_EQ(server_->connections(), 4);
  // Once they go, it is served again.
  idle.clear();
  const absl::Time drained = absl::Now() + absl::Seconds(10);
  while (server_->connections() > 0 && absl::Now() < drained) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(Get("/api/jobs").status, 200);
}

TEST(DashboardOptionsTest, NonLoopbackNeedsTlsAndTokensOrInsecure) {
  CoordinatorServerOptions o;
  o.state_dir = "/tmp/unused";
  for (const char* loopback : {"127.0.0.1:0", "localhost:8080", "[::1]:8080"}) {
    o.http_listen = loopback;
    EXPECT_TRUE(ValidateServerOptions(o).ok()) << loopback;
  }
  // Without TLS: plain HTTP, refused off loopback.
  o.auth.token_file = "/tmp/tokens";
  o.http_listen = "0.0.0.0:8080";
  absl::Status st = ValidateServerOptions(o);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("--http-listen 0.0.0.0:8080 is reachable from other machines, but the "
                        "dashboard would serve plain HTTP"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("add --tls-cert FILE --tls-key FILE"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("pass --insecure"));
  // With the coordinator's certificate it serves HTTPS: allowed, no --insecure.
  o.tls.cert_file = "c.pem";
  o.tls.key_file = "c.key";
  EXPECT_TRUE(ValidateServerOptions(o).ok()) << ValidateServerOptions(o);
  // HTTPS but no tokens would show every job to anyone who reaches it.
  o.auth.token_file = "";
  st = ValidateServerOptions(o);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("authentication is not configured"));
  o.insecure = true;
  EXPECT_TRUE(ValidateServerOptions(o).ok());
  o.tls = {};
  EXPECT_TRUE(ValidateServerOptions(o).ok()) << "--insecure: plain HTTP anywhere";
  o.http_listen = "nonsense";
  EXPECT_THAT(std::string(ValidateServerOptions(o).message()), HasSubstr("--http-listen"));
}

}  // namespace
}  // namespace ddp
