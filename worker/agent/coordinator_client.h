// The worker agent's view of the coordinator: an interface (a fake in tests) and its
// gRPC implementation. Calls block for at most `deadline`.
#ifndef DDP_WORKER_AGENT_COORDINATOR_CLIENT_H_
#define DDP_WORKER_AGENT_COORDINATOR_CLIENT_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ddp/v1/worker_service.pb.h"

namespace ddp {

class CoordinatorClient {
 public:
  virtual ~CoordinatorClient() = default;
  virtual absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request,
                                                        absl::Duration deadline) = 0;
  virtual absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request,
                                                          absl::Duration deadline) = 0;
  virtual absl::Status ReportEvents(const v1::ReportEventsRequest& request,
                                    absl::Duration deadline) = 0;
  // The long poll for new tasks (WorkerService.WaitForTasks). UNIMPLEMENTED where the
  // coordinator (or a test's fake) has none: the agent then relies on heartbeats.
  virtual absl::StatusOr<v1::WaitForTasksResponse> WaitForTasks(
      const v1::WaitForTasksRequest& request, absl::Duration deadline) {
    return absl::UnimplementedError("WaitForTasks");
  }
  // Ends any WaitForTasks call in progress (CANCELLED), from another thread.
  virtual void CancelWaits() {}
  // Connects again at once, wherever the channel waits out a reconnect backoff (a
  // coordinator that came back, or a standby that took over, is tried now). No-op by
  // default.
  virtual void Reconnect() {}
  // WorkerService.Leave (ddp-worker --leave-on-exit). UNIMPLEMENTED by default.
  virtual absl::Status Leave(const v1::LeaveRequest& request, absl::Duration deadline) {
    return absl::UnimplementedError("Leave");
  }

  // Quiet heartbeats (decision 161, fence.h). Where this is true, Heartbeat takes a
  // request with `quiet` set: such a beat returns once written, with the newest answer
  // the coordinator sent since the last call, or with an empty response (acked_seq 0)
  // when it sent none; a beat with `answer_now` returns its own answer (acked_seq =
  // its beat_seq), waited for within the deadline, or DEADLINE_EXCEEDED. Every answer
  // returned names the beat it answers (acked_seq), also where the coordinator is older
  // than quiet heartbeats (it is then waited for at every beat, as before) or answers
  // unary calls. False by default (the request's quiet fields are then not looked at).
  virtual bool QuietCapable() const { return false; }
  // Called (on another thread) when an answer arrives that no Heartbeat call waits for
  // (a changed desired state), or when the heartbeat stream ends between beats: the
  // agent heartbeats at once to take it. `fn` must not call the client. After
  // SetOnAnswer(nullptr) returns, the previous `fn` is not running and is not called.
  virtual void SetOnAnswer(std::function<void()> fn) {}
};

// How the gRPC channel reconnects once the coordinator is gone. gRPC's defaults back
// off up to 120 s between connection attempts (and give each attempt 20 s), so an
// agent could go on failing fast for two minutes after the coordinator returned and
// be declared lost. Capped, a connection is back at most kMaxConnectDelay after the
// coordinator accepts connections again.
inline constexpr absl::Duration kInitialReconnectBackoff = absl::Milliseconds(100);
inline constexpr absl::Duration kMaxReconnectBackoff = absl::Seconds(1);  // gRPC adds 20% jitter.
inline constexpr absl::Duration kConnectTimeout = absl::Seconds(2);  // Per attempt (a blackhole).
inline constexpr absl::Duration kMaxConnectDelay = kConnectTimeout;  // >= 1.2 * kMaxReconnectBackoff.

// HTTP/2 keepalive: a ping after kKeepaliveTime without one, the connection closed when
// its ack is not back within kKeepaliveTimeout. A connection that a silent cut (a
// dropping firewall, a dead switch port) left open is so found dead within
// kKeepaliveTime + kKeepaliveTimeout and the channel starts reconnecting (bounded as
// above): once the cut heals the worker is back within about kMaxConnectDelay, however
// long the cut lasted. Without it, the old connection waited on TCP's retransmission
// back-off (back 7.6 s after a 20 s cut healed; issue 30 saw 11.6 s after a 15 s cut
// and more than 42 s after a 60 s one). The
// coordinator accepts pings this often (coordinator/server.cc).
inline constexpr absl::Duration kKeepaliveTime = absl::Seconds(5);
inline constexpr absl::Duration kKeepaliveTimeout = absl::Seconds(3);

// The channel arguments that bound reconnection and keep the connection alive
// (above): pass them to MakeChannel.
grpc::ChannelArguments CoordinatorChannelArgs();

// `target` is HOST:PORT. The channel reconnects by itself (as above); calls fail fast
// with UNAVAILABLE while the coordinator is down.
std::unique_ptr<CoordinatorClient> MakeGrpcCoordinatorClient(const std::string& target);
// Over a channel of the caller's making (TLS, a client certificate, a token:
// common/rpc/credentials.h).
std::unique_ptr<CoordinatorClient> MakeGrpcCoordinatorClient(
    std::shared_ptr<grpc::Channel> channel);

// Several coordinators in standby (--coordinator a:29400,b:29400): calls go to one of
// `clients` (addresses[i]'s), first the first. A standby's answer naming the leader
// (common/rpc/leader.h) sends the call on to it at once. A call that finds its
// coordinator gone or not leading (UNAVAILABLE; a deadline, except a long poll's)
// moves the next call to the named leader, or else to the next address; the failed
// call returns its error, which the agent handles as any outage. The first cluster id a coordinator
// answers with is kept: a coordinator of another store (another cluster id) is refused
// with UNAVAILABLE naming both, and the next call moves on.
std::unique_ptr<CoordinatorClient> MakeFollowingCoordinatorClient(
    std::vector<std::string> addresses, std::vector<std::unique_ptr<CoordinatorClient>> clients);

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_COORDINATOR_CLIENT_H_
