// Hostile traffic against a real coordinator server on loopback: garbage bytes,
// half-open and idle connections in numbers, and oversized messages. Whatever arrives,
// the server keeps serving the well-behaved client next to it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpcpp/client_context.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/credentials.h"
#include "common/rpc/status.h"
#include "coordinator/rpc/request_limits.h"
#include "coordinator/server.h"
#include "ddp/v1/job_service.grpc.pb.h"
#include "ddp/v1/worker_service.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/common/test_util.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::HasSubstr;

// A raw TCP connection to the server's port, closed on destruction.
class RawConnection {
 public:
  explicit RawConnection(int port) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawConnection() { ::close(fd_); }
  bool connected() const { return connected_; }
  void Send(const std::string& bytes) {
    (void)!::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }

 private:
  int fd_;
  bool connected_ = false;
};

class RobustnessTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    const std::string dir = testing::MakeTempDir("robust");
    CoordinatorServerOptions o;
    o.listen = "127.0.0.1:0";
    o.state_dir = dir + "/state";
    ChannelSecurity security;
    if (GetParam()) {  // TLS, certificates from the script users run.
      const std::string certs = dir + "/certs";
      ASSERT_EQ(std::system(("/bin/bash " DDP_SOURCE_DIR "/scripts/make_certs.sh " + certs +
                             " >/dev/null")
                                .c_str()),
                0);
      o.tls = {certs + "/coordinator.pem", certs + "/coordinator.key", certs + "/ca.pem"};
      security.ca_file = certs + "/ca.pem";
      security.cert_file = certs + "/worker-1.pem";  // WorkerService wants a worker.
      security.key_file = certs + "/worker-1.key";
    }
    auto server = CoordinatorServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    auto channel = MakeChannel(absl::StrCat("127.0.0.1:", server_->port()), security);
    ASSERT_TRUE(channel.ok()) << channel.status();
    jobs_ = v1::JobService::NewStub(*channel);
    workers_ = v1::WorkerService::NewStub(*channel);
  }

  // The well-behaved client's call.
  absl::Status Served() {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    v1::ListWorkersResponse resp;
    return FromGrpcStatus(jobs_->ListWorkers(&ctx, v1::ListWorkersRequest(), &resp));
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
};

TEST_P(RobustnessTest, GarbageBytesAndHalfFinishedHandshakesLeaveItServing) {
  ASSERT_TRUE(Served().ok());
  absl::BitGen rng;
  const std::string preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  const std::vector<std::string> payloads = {
      "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
      preface,                                             // Then silence.
      preface + std::string("\xff\xff\xff\x01\x00\x00\x00\x00\x01", 9),  // A 16 MB frame header.
      preface + std::string(200, '\0'),
      std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11),    // A torn TLS hello.
  };
  std::vector<std::unique_ptr<RawConnection>> conns;
  for (int i = 0; i < 100; ++i) {
    auto c = std::make_unique<RawConnection>(server_->port());
    ASSERT_TRUE(c->connected());
    if (i < static_cast<int>(payloads.size())) {
      c->Send(payloads[static_cast<size_t>(i)]);
    } else {
      std::string noise(absl::Uniform(rng, 1, 4096), '\0');
      for (char& ch : noise) ch = static_cast<char>(absl::Uniform(rng, 0, 256));
      c->Send(noise);
    }
    conns.push_back(std::move(c));
  }
  EXPECT_TRUE(Served().ok()) << "while 100 hostile connections are open";
  conns.clear();
  EXPECT_TRUE(Served().ok());
}

TEST_P(RobustnessTest, AFloodOfIdleConnectionsLeavesItServing) {
  std::vector<std::unique_ptr<RawConnection>> conns;
  for (int i = 0; i < 1000; ++i) {
    conns.push_back(std::make_unique<RawConnection>(server_->port()));
    ASSERT_TRUE(conns.back()->connected()) << "connection " << i;
  }
  EXPECT_TRUE(Served().ok()) << "with 1000 idle connections open";
  conns.clear();
  EXPECT_TRUE(Served().ok());
}

TEST_P(RobustnessTest, OversizedRequestsAreRefusedWithResourceExhausted) {
  {
    grpc::ClientContext ctx;
    v1::SubmitJobRequest req;
    req.set_spec_yaml(std::string(kMaxRequestBytes + 1024, '#'));
    v1::SubmitJobResponse resp;
    EXPECT_THAT(FromGrpcStatus(jobs_->SubmitJob(&ctx, req, &resp)),
                StatusIs(absl::StatusCode::kResourceExhausted));
  }
  {
    grpc::ClientContext ctx;
    v1::SubmitJobRequest req;
    req.set_spec_yaml(std::string(100 * 1024, '#'));
    v1::SubmitJobResponse resp;
    EXPECT_THAT(FromGrpcStatus(jobs_->SubmitJob(&ctx, req, &resp)),
                StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("spec size limit")));
  }
  {
    grpc::ClientContext ctx;
    v1::ReportEventsRequest req;
    req.set_worker("worker-1");
    for (int i = 0; i <= kMaxEventsPerBatch; ++i) req.add_events()->set_rank(i);
    v1::ReportEventsResponse resp;
    EXPECT_THAT(FromGrpcStatus(workers_->ReportEvents(&ctx, req, &resp)),
                StatusIs(absl::StatusCode::kResourceExhausted,
                         HasSubstr("a ReportEvents batch holds at most 10000 events")));
  }
  {
    grpc::ClientContext ctx;
    v1::RegisterRequest req;
    req.set_worker("w1\x1b[2J");
    req.set_incarnation("i");
    req.set_slots(1);
    v1::RegisterResponse resp;
    // Over TLS the certificate speaks for worker-1 only, so the name is refused first.
    EXPECT_THAT(FromGrpcStatus(workers_->Register(&ctx, req, &resp)),
                StatusIs(GetParam() ? absl::StatusCode::kPermissionDenied
                                    : absl::StatusCode::kInvalidArgument,
                         HasSubstr(GetParam() ? "may not speak for" : "worker names are")));
  }
  EXPECT_TRUE(Served().ok());
}

INSTANTIATE_TEST_SUITE_P(PlaintextAndTls, RobustnessTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Tls" : "Plaintext";
                         });

}  // namespace
}  // namespace ddp
