#include "worker/agent/coordinator_client.h"

#include <grpcpp/client_context.h>
#include <grpc/grpc.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/support/channel_arguments.h>

#include <functional>
#include <optional>
#include <set>
#include <thread>
#include <type_traits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/rpc/leader.h"
#include "common/rpc/status.h"
#include "ddp/v1/worker_service.grpc.pb.h"

namespace ddp {
namespace {

int Millis(absl::Duration d) { return static_cast<int>(absl::ToInt64Milliseconds(d)); }

}  // namespace

grpc::ChannelArguments CoordinatorChannelArgs() {
  // Jitter included, gRPC never waits longer than an attempt may take.
  DDP_CHECK(kMaxConnectDelay >= kMaxReconnectBackoff * 1.2);
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, Millis(kInitialReconnectBackoff));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, Millis(kMaxReconnectBackoff));
  // gRPC's "min reconnect backoff" is the shortest time a connection attempt is given.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, Millis(kConnectTimeout));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, Millis(kKeepaliveTime));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Millis(kKeepaliveTimeout));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);  // Ping however idle the channel.
  return args;
}

namespace {

// Cancels a call that outlives its deadline: what a stream's messages, which have no
// deadline of their own, need. One call armed at a time.
class Watchdog {
 public:
  Watchdog() : thread_([this] { Loop(); }) {}
  ~Watchdog() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  void Arm(grpc::ClientContext* ctx, absl::Time until) {
    absl::MutexLock lock(&mu_);
    ++generation_;
    ctx_ = ctx;
    until_ = until;
    fired_ = false;
  }
  // Whether it had to cancel the call.
  bool Disarm() {
    absl::MutexLock lock(&mu_);
    ++generation_;
    ctx_ = nullptr;
    return fired_;
  }

 private:
  void Loop() {
    absl::MutexLock lock(&mu_);
    while (!stop_) {
      const uint64_t generation = generation_;
      auto changed = [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || generation_ != generation;
      };
      if (ctx_ == nullptr) {
        mu_.Await(absl::Condition(&changed));
        continue;
      }
      if (!mu_.AwaitWithDeadline(absl::Condition(&changed), until_)) {
        ctx_->TryCancel();
        ctx_ = nullptr;
        fired_ = true;
      }
    }
  }

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::ClientContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Time until_ ABSL_GUARDED_BY(mu_);
  bool fired_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

class GrpcCoordinatorClient final : public CoordinatorClient {
 public:
  explicit GrpcCoordinatorClient(std::shared_ptr<grpc::Channel> channel)
      : channel_(channel), stub_(v1::WorkerService::NewStub(std::move(channel))) {}

  void Reconnect() override { grpc::experimental::ChannelResetConnectionBackoff(channel_.get()); }
  ~GrpcCoordinatorClient() override {
    absl::MutexLock lock(&beat_mu_);
    if (stream_ != nullptr) {
      beat_ctx_->TryCancel();
      EndStreamLocked();
    }
  }

  bool QuietCapable() const override { return true; }
  void SetOnAnswer(std::function<void()> fn) override {
    absl::MutexLock lock(&inbox_mu_);
    on_answer_ = std::move(fn);
  }

  // Heartbeats go over one stream (WorkerService.HeartbeatStream), opened again after
  // it breaks; a coordinator without it (UNIMPLEMENTED) gets unary calls from then on.
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req,
                                                  absl::Duration deadline) override {
    {
      absl::MutexLock lock(&beat_mu_);
      if (!unary_only_) {
        auto beat = req.quiet() ? QuietBeatLocked(req, deadline) : StreamBeatLocked(req, deadline);
        if (!absl::IsUnimplemented(beat.status())) return beat;
        unary_only_ = true;
        DDP_LOG(INFO) << "the coordinator has no heartbeat stream (an older release): "
                         "heartbeats go as single calls";
      }
    }
    auto resp = UnaryHeartbeat(req, deadline);
    if (resp.ok() && req.quiet()) resp->set_acked_seq(req.beat_seq());  // Each call answered.
    return resp;
  }

  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& req,
                                                absl::Duration deadline) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    v1::RegisterResponse resp;
    absl::Status st = FromGrpcStatus(stub_->Register(&ctx, req, &resp));
    if (!st.ok()) return st;
    return resp;
  }

  absl::StatusOr<v1::HeartbeatResponse> UnaryHeartbeat(const v1::HeartbeatRequest& req,
                                                       absl::Duration deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    v1::HeartbeatResponse resp;
    absl::Status st = FromGrpcStatus(stub_->Heartbeat(&ctx, req, &resp));
    if (!st.ok()) return st;
    return resp;
  }

  absl::Status Leave(const v1::LeaveRequest& req, absl::Duration deadline) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    v1::LeaveResponse resp;
    return FromGrpcStatus(stub_->Leave(&ctx, req, &resp));
  }

  absl::StatusOr<v1::WaitForTasksResponse> WaitForTasks(const v1::WaitForTasksRequest& req,
                                                        absl::Duration deadline) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    {
      absl::MutexLock lock(&wait_mu_);
      if (waits_cancelled_) return absl::CancelledError("stopping");
      wait_ctx_ = &ctx;
    }
    v1::WaitForTasksResponse resp;
    absl::Status st = FromGrpcStatus(stub_->WaitForTasks(&ctx, req, &resp));
    {
      absl::MutexLock lock(&wait_mu_);
      wait_ctx_ = nullptr;
    }
    if (!st.ok()) return st;
    return resp;
  }

  void CancelWaits() override {
    absl::MutexLock lock(&wait_mu_);
    waits_cancelled_ = true;
    if (wait_ctx_ != nullptr) wait_ctx_->TryCancel();
  }

  absl::Status ReportEvents(const v1::ReportEventsRequest& req, absl::Duration deadline) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    v1::ReportEventsResponse resp;
    return FromGrpcStatus(stub_->ReportEvents(&ctx, req, &resp));
  }

 private:
  // Quiet beats (decision 161): answers are read on a thread of the stream's own and
  // kept in the inbox; a beat waits only for the answer it asks for (answer_now, or
  // every beat where the coordinator turned out older than quiet beats).
  absl::StatusOr<v1::HeartbeatResponse> QuietBeatLocked(const v1::HeartbeatRequest& req,
                                                        absl::Duration deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(beat_mu_) {
    v1::HeartbeatRequest beat = req;
    if (stream_ == nullptr) {
      beat_ctx_ = std::make_unique<grpc::ClientContext>();
      stream_ = stub_->HeartbeatStream(beat_ctx_.get());
      {
        absl::MutexLock lock(&inbox_mu_);
        inbox_.reset();
        inbox_ended_ = false;
        inbox_answers_ = 0;
        awaited_seq_ = 0;
        quiet_coordinator_.reset();
      }
      reader_ = std::thread([this, stream = stream_.get()] { ReadAnswers(stream); });
      beat.set_answer_now(true);  // The first answer says whether the coordinator is quiet.
    }
    bool wait;
    int64_t answers_before;
    {
      absl::MutexLock lock(&inbox_mu_);
      if (quiet_coordinator_ != true) beat.set_answer_now(true);
      wait = beat.answer_now();
      answers_before = inbox_answers_;
      awaited_seq_ = wait ? beat.beat_seq() : 0;
      in_call_ = true;  // The stream's end is this call's to report.
    }
    struct Out {
      GrpcCoordinatorClient* self;
      ~Out() {
        absl::MutexLock lock(&self->inbox_mu_);
        self->in_call_ = false;
      }
    } out{this};
    const absl::Time until = absl::Now() + deadline;
    watchdog_.Arm(beat_ctx_.get(), until);
    const bool written = stream_->Write(beat);
    bool timed_out = false;
    if (written) {
      absl::MutexLock lock(&inbox_mu_);
      auto answered = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(inbox_mu_) {
        // An older coordinator answers every beat in turn, naming none.
        return inbox_.has_value() &&
               (inbox_->acked_seq() >= beat.beat_seq() ||
                (inbox_->acked_seq() == 0 && inbox_answers_ > answers_before));
      };
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(inbox_mu_) {
        return !wait || inbox_ended_ || answered();
      };
      // The watchdog cancels the stream at the deadline, which ends the reader.
      timed_out = !inbox_mu_.AwaitWithDeadline(absl::Condition(&ready), until + absl::Seconds(1));
      awaited_seq_ = 0;
      if ((wait && answered()) || (!wait && !inbox_ended_)) {
        (void)watchdog_.Disarm();
        if (!inbox_.has_value()) return v1::HeartbeatResponse();  // Nothing new said.
        v1::HeartbeatResponse answer = *std::move(inbox_);
        inbox_.reset();
        if (answer.acked_seq() == 0) answer.set_acked_seq(beat.beat_seq());
        return answer;
      }
    }
    // The stream is over for this client. Its reader sees the end first (at the latest
    // when the watchdog cancels the call at the deadline), so that Finish reports the
    // coordinator's status (NOT_FOUND, a standby's leader, ...), not a cancellation.
    bool ended;
    {
      absl::MutexLock lock(&inbox_mu_);
      inbox_mu_.AwaitWithDeadline(absl::Condition(&inbox_ended_), timed_out ? absl::Now() : until);
      ended = inbox_ended_;
    }
    const bool expired = watchdog_.Disarm();
    if (!ended) beat_ctx_->TryCancel();
    const grpc::Status st = EndStreamLocked();
    if (expired || timed_out) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no answer to a heartbeat within ", absl::FormatDuration(deadline)));
    }
    if (st.ok()) return absl::UnavailableError("the coordinator closed the heartbeat stream");
    return FromGrpcStatus(st);
  }

  // The quiet stream's reader: every answer into the inbox (the newest replaces an
  // older one nobody took: the protocol is declarative), the agent told of those no
  // beat waits for, and of the end.
  void ReadAnswers(grpc::ClientReaderWriter<v1::HeartbeatRequest, v1::HeartbeatResponse>* stream) {
    v1::HeartbeatResponse resp;
    // The agent is told under inbox_mu_ (its callback only wakes its loop), so that
    // SetOnAnswer(nullptr) returns only once no call of the old one is left.
    while (stream->Read(&resp)) {
      absl::MutexLock lock(&inbox_mu_);
      ++inbox_answers_;
      if (!quiet_coordinator_.has_value()) quiet_coordinator_ = resp.acked_seq() != 0;
      const bool awaited = awaited_seq_ != 0 &&
                           (resp.acked_seq() >= awaited_seq_ || resp.acked_seq() == 0);
      inbox_ = resp;
      if (!awaited && on_answer_) on_answer_();
    }
    absl::MutexLock lock(&inbox_mu_);
    inbox_ended_ = true;
    // Between beats (the coordinator ended the stream): the agent beats at once and
    // finds out. During one, that beat reports it (and the agent backs off).
    if (!in_call_ && on_answer_) on_answer_();
  }

  // Joins the reader (the stream's reads are over or cancelled) and finishes the call.
  grpc::Status EndStreamLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(beat_mu_) {
    if (reader_.joinable()) reader_.join();
    const grpc::Status st = stream_->Finish();
    stream_.reset();
    beat_ctx_.reset();
    return st;
  }

  absl::StatusOr<v1::HeartbeatResponse> StreamBeatLocked(const v1::HeartbeatRequest& req,
                                                         absl::Duration deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(beat_mu_) {
    if (stream_ != nullptr && reader_.joinable()) {  // A quiet stream: not this kind.
      beat_ctx_->TryCancel();
      (void)EndStreamLocked();
    }
    if (stream_ == nullptr) {
      beat_ctx_ = std::make_unique<grpc::ClientContext>();
      stream_ = stub_->HeartbeatStream(beat_ctx_.get());
    }
    watchdog_.Arm(beat_ctx_.get(), absl::Now() + deadline);
    v1::HeartbeatResponse resp;
    const bool answered = stream_->Write(req) && stream_->Read(&resp);
    const bool expired = watchdog_.Disarm();
    if (answered) return resp;
    // The stream is over: its status says why; the next beat opens another.
    const grpc::Status st = stream_->Finish();
    stream_.reset();
    beat_ctx_.reset();
    if (expired) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no answer to a heartbeat within ", absl::FormatDuration(deadline)));
    }
    if (st.ok()) return absl::UnavailableError("the coordinator closed the heartbeat stream");
    return FromGrpcStatus(st);
  }

  const std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  absl::Mutex beat_mu_;  // One beat at a time: the stream carries one exchange.
  std::unique_ptr<grpc::ClientContext> beat_ctx_ ABSL_GUARDED_BY(beat_mu_);
  std::unique_ptr<grpc::ClientReaderWriter<v1::HeartbeatRequest, v1::HeartbeatResponse>> stream_
      ABSL_GUARDED_BY(beat_mu_);
  bool unary_only_ ABSL_GUARDED_BY(beat_mu_) = false;
  std::thread reader_;  // A quiet stream's (ReadAnswers); started and joined under beat_mu_.
  absl::Mutex inbox_mu_;
  std::optional<v1::HeartbeatResponse> inbox_ ABSL_GUARDED_BY(inbox_mu_);  // Not yet taken.
  bool inbox_ended_ ABSL_GUARDED_BY(inbox_mu_) = false;  // The stream's reads are over.
  int64_t inbox_answers_ ABSL_GUARDED_BY(inbox_mu_) = 0;
  uint64_t awaited_seq_ ABSL_GUARDED_BY(inbox_mu_) = 0;  // The beat a call waits for.
  bool in_call_ ABSL_GUARDED_BY(inbox_mu_) = false;     // A quiet beat is being sent.
  // Whether this stream's coordinator names the beats it answers (unknown until the
  // first answer).
  std::optional<bool> quiet_coordinator_ ABSL_GUARDED_BY(inbox_mu_);
  std::function<void()> on_answer_ ABSL_GUARDED_BY(inbox_mu_);
  Watchdog watchdog_;
  absl::Mutex wait_mu_;
  grpc::ClientContext* wait_ctx_ ABSL_GUARDED_BY(wait_mu_) = nullptr;  // The open poll.
  bool waits_cancelled_ ABSL_GUARDED_BY(wait_mu_) = false;
};

}  // namespace

namespace {

class FollowingClient final : public CoordinatorClient {
 public:
  FollowingClient(std::vector<std::string> addresses,
                  std::vector<std::unique_ptr<CoordinatorClient>> clients)
      : addresses_(std::move(addresses)), clients_(std::move(clients)) {}

  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& req,
                                                absl::Duration deadline) override {
    // Named, so that a coordinator of another store refuses the worker before it keeps
    // any record of it.
    v1::RegisterRequest named = req;
    {
      absl::MutexLock lock(&mu_);
      named.set_cluster_id(cluster_);
    }
    return Call(true, [&](CoordinatorClient& c) { return c.Register(named, deadline); });
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req,
                                                  absl::Duration deadline) override {
    return Call(true, [&](CoordinatorClient& c) { return c.Heartbeat(req, deadline); });
  }
  absl::Status ReportEvents(const v1::ReportEventsRequest& req, absl::Duration deadline) override {
    return Call(true, [&](CoordinatorClient& c) { return c.ReportEvents(req, deadline); });
  }
  absl::StatusOr<v1::WaitForTasksResponse> WaitForTasks(const v1::WaitForTasksRequest& req,
                                                        absl::Duration deadline) override {
    return Call(false, [&](CoordinatorClient& c) { return c.WaitForTasks(req, deadline); });
  }
  void CancelWaits() override {
    for (auto& c : clients_) c->CancelWaits();
  }
  void Reconnect() override {
    for (auto& c : clients_) c->Reconnect();
  }
  bool QuietCapable() const override {
    for (const auto& c : clients_) {
      if (!c->QuietCapable()) return false;
    }
    return true;
  }
  void SetOnAnswer(std::function<void()> fn) override {
    for (auto& c : clients_) c->SetOnAnswer(fn);
  }
  absl::Status Leave(const v1::LeaveRequest& req, absl::Duration deadline) override {
    return Call(true, [&](CoordinatorClient& c) { return c.Leave(req, deadline); });
  }

 private:
  static const absl::Status& StatusOf(const absl::Status& s) { return s; }
  template <typename T>
  static const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
    return s.status();
  }
  static const std::string* ClusterOf(const absl::Status&) { return nullptr; }
  template <typename T>
  static const std::string* ClusterOf(const absl::StatusOr<T>& s) {
    if constexpr (std::is_same_v<T, v1::RegisterResponse> ||
                  std::is_same_v<T, v1::HeartbeatResponse>) {
      if (s.ok()) return &s->cluster_id();
    }
    return nullptr;
  }

  template <typename Fn>
  auto Call(bool move_on_deadline, Fn&& fn) -> decltype(fn(std::declval<CoordinatorClient&>())) {
    size_t at;
    {
      absl::MutexLock lock(&mu_);
      at = current_;
    }
    auto result = fn(*clients_[at]);
    if (auto leader = LeaderNamedIn(StatusOf(result))) {
      // A standby named the leader: ask it at once rather than miss a beat.
      for (size_t i = 0; i < addresses_.size(); ++i) {
        if (addresses_[i] != *leader || i == at) continue;
        MoveOn(at, StatusOf(result));
        at = i;
        result = fn(*clients_[at]);
        break;
      }
    }
    const absl::Status& st = StatusOf(result);
    if (absl::IsUnavailable(st) || (move_on_deadline && absl::IsDeadlineExceeded(st)) ||
        IsOtherCluster(st)) {
      MoveOn(at, st);
      return result;
    }
    if (const std::string* cluster = ClusterOf(result); cluster != nullptr && !cluster->empty()) {
      absl::MutexLock lock(&mu_);
      if (cluster_.empty()) {
        cluster_ = *cluster;
        cluster_at_ = addresses_[at];
      } else if (*cluster != cluster_) {
        // UNAVAILABLE: for the agent, this coordinator is not there (it keeps trying
        // the others); FAILED_PRECONDITION would read as a stale incarnation, and stop it.
        absl::Status refused = absl::UnavailableError(absl::StrCat(
            "the coordinator at ", addresses_[at], " serves another cluster (store cluster id ",
            *cluster, ") than the one this worker joined through ", cluster_at_, " (", cluster_,
            "): every --coordinator address must be a coordinator of the same store; not "
            "following it"));
        if (warned_.insert(addresses_[at]).second) DDP_LOG(ERROR) << refused.message();
        current_ = (at + 1) % clients_.size();
        return refused;
      }
    }
    return result;
  }

  // A coordinator's refusal of a worker of another cluster (Coordinator::Register).
  static bool IsOtherCluster(const absl::Status& st) {
    return absl::IsFailedPrecondition(st) &&
           absl::StrContains(st.message(), "must be a coordinator of the same store");
  }

  void MoveOn(size_t from, const absl::Status& why) {
    absl::MutexLock lock(&mu_);
    if (current_ != from) return;  // Another call moved already.
    current_ = NextCoordinator(addresses_, from, why);
    if (current_ != from) {
      DDP_LOG(INFO) << "coordinator " << addresses_[from] << ": " << why.message() << "; trying "
                    << addresses_[current_];
      // Tried at the next call, not after the reconnect backoff its channel may still
      // wait out from when that coordinator was down (a restart, a hand-over): it may
      // lead by now. The calls are paced by the heartbeat interval already.
      clients_[current_]->Reconnect();
    }
  }

  const std::vector<std::string> addresses_;
  const std::vector<std::unique_ptr<CoordinatorClient>> clients_;
  absl::Mutex mu_;
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
  std::string cluster_ ABSL_GUARDED_BY(mu_);     // The first cluster id answered.
  std::string cluster_at_ ABSL_GUARDED_BY(mu_);  // Who answered it.
  std::set<std::string> warned_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<CoordinatorClient> MakeFollowingCoordinatorClient(
    std::vector<std::string> addresses, std::vector<std::unique_ptr<CoordinatorClient>> clients) {
  return std::make_unique<FollowingClient>(std::move(addresses), std::move(clients));
}

std::unique_ptr<CoordinatorClient> MakeGrpcCoordinatorClient(const std::string& target) {
  return MakeGrpcCoordinatorClient(
      grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), CoordinatorChannelArgs()));
}

std::unique_ptr<CoordinatorClient> MakeGrpcCoordinatorClient(
    std::shared_ptr<grpc::Channel> channel) {
  return std::make_unique<GrpcCoordinatorClient>(std::move(channel));
}

}  // namespace ddp
