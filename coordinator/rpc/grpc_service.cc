#include "coordinator/rpc/grpc_service.h"

#include <functional>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/rpc/status.h"
#include "coordinator/rpc/request_limits.h"

namespace ddp {
namespace {

// A call refused before it reached the service logic (authorization, bounds).
grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* ctx, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

template <typename Message>
class RefusedStream final : public grpc::ServerWriteReactor<Message> {
 public:
  explicit RefusedStream(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

// The caller's identity when the method admits them and `bounds` is OK.
absl::StatusOr<Identity> Admit(const Authorizer* auth, const grpc::CallbackServerContext& ctx,
                               Method method, const absl::Status& bounds = absl::OkStatus(),
                               const std::string& worker = "") {
  auto caller = auth->Check(ctx, method, worker);
  if (!caller.ok()) return caller;
  if (!bounds.ok()) return bounds;
  return caller;
}

template <typename T, typename Fill>
grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, const absl::StatusOr<T>& result,
                                Fill&& fill) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (result.ok()) fill(*result);
  reactor->Finish(ToGrpcStatus(result.status()));
  return reactor;
}

// A server stream fed by EventHub notifications.
//
// The hub holds a shared Link. Its Notify() (on whatever thread changed the job) only
// queues one pull on the fan-out thread, coalescing bursts. There the stream marks
// itself dirty and, when no write is in flight, pulls its next message (Next()) and
// writes it; a write that completes with the stream dirty queues the next pull. So
// every pull happens on the fan-out thread, never on an ingesting thread nor inside a
// gRPC reaction, and at most one write is in flight: a slow reader gets the newest
// state when it is ready, not a backlog. Finishing is decided under the stream's lock
// and done after releasing it, as is every StartWrite.
//
// Lifetime: OnDone() detaches the Link, which waits for a pull in progress on the
// fan-out thread, then deletes the stream; pulls queued later find no stream. gRPC
// calls OnDone() only after the reactions in progress have returned and after
// Finish(), and nothing writes once Finish() has been decided.
template <typename Message>
class HubStream : public grpc::ServerWriteReactor<Message> {
 public:
  HubStream(EventHub* hub, FanOutExecutor* fanout, std::string job_id)
      : hub_(hub), fanout_(fanout), job_id_(std::move(job_id)) {}

  // Runs once the stream is done (its StreamSlots count is given back).
  void OnRelease(std::function<void()> release) { release_ = std::move(release); }

  void Start() {
    link_ = std::make_shared<Link>(this, fanout_);
    hub_->Subscribe(job_id_, link_);
    link_->Notify();  // The first pull sends the full state.
  }

  void OnWriteDone(bool ok) override {
    Decision action;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) cancelled_ = true;
      action = DecideLocked(/*may_pull=*/false);
    }
    Act(action);
  }

  void OnCancel() override {
    Decision action;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      action = DecideLocked(/*may_pull=*/false);
    }
    Act(action);
  }

  void OnDone() override {
    link_->Detach();
    hub_->Unsubscribe(job_id_, link_.get());
    if (release_) release_();
    delete this;
  }

 protected:
  // The next message to send, or nullopt when there is nothing new. Sets `*last`
  // when the stream ends after it (`*status` is then sent), `*more` when another
  // message is ready right after this one. Runs on the fan-out thread under the
  // stream's lock: it may read the coordinator and the hub, which never call back
  // into a stream under their locks (lock order: stream -> coordinator -> hub).
  virtual std::optional<Message> Next(bool* last, bool* more, grpc::Status* status) = 0;

 private:
  struct Link : EventHub::Listener, std::enable_shared_from_this<Link> {
    Link(HubStream* s, FanOutExecutor* f) : fanout(f), stream(s) {}

    // Any thread; never blocks on a pull.
    void Notify() override {
      {
        absl::MutexLock lock(&mu);
        if (stream == nullptr || queued) return;
        queued = true;
      }
      fanout->Post([self = this->shared_from_this()] { self->Run(); });
    }

    // On the fan-out thread.
    void Run() {
      HubStream* s;
      {
        absl::MutexLock lock(&mu);
        queued = false;
        if (stream == nullptr) return;
        s = stream;
        pulling = true;
      }
      s->Pull();
      absl::MutexLock lock(&mu);
      pulling = false;
    }

    // From OnDone(): no pull starts after this returns, and one in progress has ended.
    void Detach() {
      absl::MutexLock lock(&mu);
      stream = nullptr;
      if (fanout->OnFanOutThread()) return;  // Called from within our own pull.
      auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !pulling; };
      mu.Await(absl::Condition(&idle));
    }

    FanOutExecutor* const fanout;
    absl::Mutex mu;
    HubStream* stream ABSL_GUARDED_BY(mu);
    bool queued ABSL_GUARDED_BY(mu) = false;   // A Run() is waiting on the fan-out thread.
    bool pulling ABSL_GUARDED_BY(mu) = false;  // A Run() is using `stream`.
  };

  enum class Action { kNone, kWrite, kFinish, kPull };
  // What to do once the lock is released; a finish carries its status, copied under
  // the lock.
  struct Decision {
    Decision(Action a = Action::kNone, grpc::Status s = grpc::Status())  // NOLINT: implicit
        : action(a), status(std::move(s)) {}
    Action action;
    grpc::Status status;
  };

  // On the fan-out thread: the job changed, or the last write left us dirty.
  void Pull() {
    Decision action;
    {
      absl::MutexLock lock(&mu_);
      dirty_ = true;
      action = DecideLocked(/*may_pull=*/true);
    }
    Act(action);
  }

  // What to do next. Pulls (Next()) only when `may_pull`, i.e. on the fan-out thread;
  // elsewhere a pending pull becomes kPull, which queues one there.
  Decision DecideLocked(bool may_pull) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || writing_) return {Action::kNone};
    if (cancelled_) {
      finished_ = true;
      status_ = grpc::Status::CANCELLED;
      return {Action::kFinish, status_};
    }
    if (ending_) {
      finished_ = true;
      return {Action::kFinish, status_};
    }
    if (!dirty_) return {Action::kNone};
    if (!may_pull) return {Action::kPull};
    dirty_ = false;
    bool last = false, more = false;
    std::optional<Message> next = Next(&last, &more, &status_);
    if (last) ending_ = true;
    if (more) dirty_ = true;
    if (next.has_value()) {
      message_ = std::move(*next);
      writing_ = true;
      return {Action::kWrite};
    }
    if (ending_) {
      finished_ = true;
      return {Action::kFinish, status_};
    }
    return {Action::kNone};
  }

  void Act(const Decision& decision) {
    switch (decision.action) {
      case Action::kWrite:
        this->StartWrite(&message_);  // message_ is ours alone until OnWriteDone.
        break;
      case Action::kFinish:
        this->Finish(decision.status);  // The last use of `this`: OnDone may follow at once.
        break;
      case Action::kPull:
        link_->Notify();
        break;
      case Action::kNone:
        break;
    }
  }

  EventHub* const hub_;
  FanOutExecutor* const fanout_;
  const std::string job_id_;
  std::shared_ptr<Link> link_;
  std::function<void()> release_;
  absl::Mutex mu_;
  bool dirty_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  Message message_;
};

// WatchJob: the job's newest state each time; ends after a terminal state is sent.
class JobWatch final : public HubStream<v1::Job> {
 public:
  JobWatch(Coordinator* coordinator, EventHub* hub, FanOutExecutor* fanout, std::string job_id)
      : HubStream(hub, fanout, job_id), coordinator_(coordinator), job_id_(std::move(job_id)) {}

 protected:
  std::optional<v1::Job> Next(bool* last, bool* more, grpc::Status* status) override {
    auto job = coordinator_->GetJob(job_id_);
    if (!job.ok()) {
      *last = true;
      *status = ToGrpcStatus(job.status());
      return std::nullopt;
    }
    *last = IsTerminal(job->state());
    job->clear_spec_yaml();
    return *std::move(job);
  }

 private:
  Coordinator* const coordinator_;
  const std::string job_id_;
};

// StreamLogs: stored lines in batches, then (follow) new lines until the job ends.
class LogStream final : public HubStream<v1::LogBatch> {
 public:
  LogStream(Coordinator* coordinator, EventHub* hub, FanOutExecutor* fanout,
            const v1::StreamLogsRequest& req)
      : HubStream(hub, fanout, req.job_id()), coordinator_(coordinator), hub_(hub), req_(req),
        after_seq_(req.after_seq()) {}

 protected:
  std::optional<v1::LogBatch> Next(bool* last, bool* more, grpc::Status* status) override {
    std::optional<int> rank;
    if (req_.has_rank()) rank = req_.rank();
    // Read the job's state before its lines: lines that arrive in between are sent
    // by the next pull, and a job seen as finished has reported all of its output.
    auto job = coordinator_->GetJob(req_.job_id());
    if (!job.ok()) {
      *last = true;
      *status = ToGrpcStatus(job.status());
      return std::nullopt;
    }
    const bool finished = IsTerminal(job->state());
    std::vector<v1::LogLine> lines = hub_->Logs(req_.job_id(), after_seq_, rank, kBatch);
    if (lines.empty()) {
      *last = !req_.follow() || finished;
      return std::nullopt;
    }
    after_seq_ = lines.back().seq();
    v1::LogBatch batch;
    for (auto& l : lines) *batch.add_lines() = std::move(l);
    *more = true;  // Pull again after this write: more lines may be stored already.
    return batch;
  }

 private:
  static constexpr int kBatch = 1000;

  Coordinator* const coordinator_;
  EventHub* const hub_;
  const v1::StreamLogsRequest req_;
  int64_t after_seq_;
};

}  // namespace

absl::Status StreamSlots::Acquire(const std::string& caller) {
  absl::MutexLock lock(&mu_);
  if (total_ >= limits_.total) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the coordinator has ", total_, " watch and log streams open, its --max-streams is ",
        limits_.total, ": close some (ddpctl watch / logs -f) and try again"));
  }
  if (!caller.empty()) {
    int64_t& mine = by_caller_[caller];
    if (mine >= limits_.per_caller) {
      return absl::ResourceExhaustedError(absl::StrCat(
          caller, " has ", mine, " watch and log streams open, the coordinator's "
          "--max-streams-per-caller is ", limits_.per_caller,
          ": close some (ddpctl watch / logs -f) and try again"));
    }
    ++mine;
  }
  ++total_;
  return absl::OkStatus();
}

void StreamSlots::Release(const std::string& caller) {
  absl::MutexLock lock(&mu_);
  --total_;
  if (caller.empty()) return;
  auto it = by_caller_.find(caller);
  if (it != by_caller_.end() && --it->second <= 0) by_caller_.erase(it);
}

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* ctx,
                                                    const v1::SubmitJobRequest* req,
                                                    v1::SubmitJobResponse* resp) {
  auto caller = Admit(auth_, *ctx, Method::kSubmitJob, CheckSubmitRequest(*req));
  if (!caller.ok()) return Refuse(ctx, caller.status());
  return Unary(ctx, coordinator_->Submit(*req, CallerOf(*caller)), [&](const v1::Job& job) {
    resp->set_job_id(job.id());
    *resp->mutable_job() = job;
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* ctx,
                                                 const v1::GetJobRequest* req, v1::Job* resp) {
  auto caller = Admit(auth_, *ctx, Method::kGetJob);
  if (!caller.ok()) return Refuse(ctx, caller.status());
  return Unary(ctx, coordinator_->GetJob(req->job_id(), req->metric_history(), CallerOf(*caller)),
               [&](const v1::Job& job) { *resp = job; });
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* ctx,
                                                   const v1::ListJobsRequest* req,
                                                   v1::ListJobsResponse* resp) {
  auto caller = Admit(auth_, *ctx, Method::kListJobs);
  if (!caller.ok()) return Refuse(ctx, caller.status());
  for (auto& job : coordinator_->ListJobs(req->limit())) *resp->add_jobs() = std::move(job);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* ctx,
                                                    const v1::CancelJobRequest* req,
                                                    v1::Job* resp) {
  auto caller = Admit(auth_, *ctx, Method::kCancelJob);
  if (!caller.ok()) return Refuse(ctx, caller.status());
  return Unary(ctx, coordinator_->Cancel(req->job_id(), CallerOf(*caller)),
               [&](const v1::Job& job) { *resp = job; });
}

grpc::ServerWriteReactor<v1::Job>* JobServiceImpl::WatchJob(grpc::CallbackServerContext* ctx,
                                                            const v1::WatchJobRequest* req) {
  auto caller = Admit(auth_, *ctx, Method::kWatchJob);
  if (!caller.ok()) return new RefusedStream<v1::Job>(caller.status());
  const std::string name = CallerOf(*caller).name;
  if (absl::Status st = slots_.Acquire(name); !st.ok()) return new RefusedStream<v1::Job>(st);
  auto* watch = new JobWatch(coordinator_, hub_, &fanout_, req->job_id());
  watch->OnRelease([this, name] { slots_.Release(name); });
  watch->Start();
  return watch;
}

grpc::ServerWriteReactor<v1::LogBatch>* JobServiceImpl::StreamLogs(
    grpc::CallbackServerContext* ctx, const v1::StreamLogsRequest* req) {
  auto caller = Admit(auth_, *ctx, Method::kStreamLogs);
  if (!caller.ok()) return new RefusedStream<v1::LogBatch>(caller.status());
  const std::string name = CallerOf(*caller).name;
  if (absl::Status st = slots_.Acquire(name); !st.ok()) {
    return new RefusedStream<v1::LogBatch>(st);
  }
  v1::StreamLogsRequest effective = *req;
  if (req->tail() > 0) {
    std::optional<int> rank;
    if (req->has_rank()) rank = req->rank();
    effective.set_after_seq(
        std::max(req->after_seq(), hub_->TailStart(req->job_id(), rank, req->tail())));
  }
  auto* stream = new LogStream(coordinator_, hub_, &fanout_, effective);
  stream->OnRelease([this, name] { slots_.Release(name); });
  stream->Start();
  return stream;
}

grpc::ServerUnaryReactor* JobServiceImpl::ListWorkers(grpc::CallbackServerContext* ctx,
                                                      const v1::ListWorkersRequest* req,
                                                      v1::ListWorkersResponse* resp) {
  auto caller = Admit(auth_, *ctx, Method::kListWorkers);
  if (!caller.ok()) return Refuse(ctx, caller.status());
  return Unary(ctx, coordinator_->ListWorkers(*req),
               [&](const v1::ListWorkersResponse& r) { *resp = r; });
}

grpc::ServerUnaryReactor* JobServiceImpl::CordonWorker(grpc::CallbackServerContext* ctx,
                                                       const v1::CordonWorkerRequest* req,
                                                       v1::Worker* resp) {
  auto caller = Admit(auth_, *ctx, Method::kCordonWorker);
  if (!caller.ok()) return Refuse(ctx, caller.status());
  return Unary(ctx,
               coordinator_->SetMaintenance(req->worker(), v1::WORKER_CORDONED,
                                            v1::DRAIN_AT_CHECKPOINT, CallerOf(*caller)),
               [&](const v1::Worker& w) { *resp = w; });
}

grpc::ServerUnaryReactor* JobServiceImpl::DrainWorker(grpc::CallbackServerContext* ctx,
                                                      const v1::DrainWorkerRequest* req,
                                                      v1::Worker* resp) {
  auto caller = Admit(auth_, *ctx, Method::kDrainWorker);
  if (!caller.ok()) return Refuse(ctx, caller.status());
  return Unary(ctx,
               coordinator_->SetMaintenance(req->worker(), v1::WORKER_DRAINING, req->policy(),
                                            CallerOf(*caller)),
               [&](const v1::Worker& w) { *resp = w; });
}

grpc::ServerUnaryReactor* JobServiceImpl::UncordonWorker(grpc::CallbackServerContext* ctx,
                                                         const v1::UncordonWorkerRequest* req,
                                                         v1::Worker* resp) {
  auto caller = Admit(auth_, *ctx, Method::kUncordonWorker);
  if (!caller.ok()) return Refuse(ctx, caller.status());
  return Unary(ctx,
               coordinator_->SetMaintenance(req->worker(), v1::WORKER_SCHEDULABLE,
                                            v1::DRAIN_AT_CHECKPOINT, CallerOf(*caller)),
               [&](const v1::Worker& w) { *resp = w; });
}

grpc::ServerUnaryReactor* JobServiceImpl::RemoveWorker(grpc::CallbackServerContext* ctx,
                                                       const v1::RemoveWorkerRequest* req,
                                                       v1::RemoveWorkerResponse* resp) {
  auto caller = Admit(auth_, *ctx, Method::kRemoveWorker);
  if (!caller.ok()) return Refuse(ctx, caller.status());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(coordinator_->RemoveWorker(req->worker())));
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::CaptureStacks(grpc::CallbackServerContext* ctx,
                                                        const v1::CaptureStacksRequest* req,
                                                        v1::CaptureStacksResponse* resp) {
  auto caller = Admit(auth_, *ctx, Method::kCaptureStacks);
  if (!caller.ok()) return Refuse(ctx, caller.status());
  return Unary(ctx, coordinator_->CaptureStacks(req->job_id(), CallerOf(*caller)),
               [&](const v1::CaptureStacksResponse& r) { *resp = r; });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Register(grpc::CallbackServerContext* ctx,
                                                      const v1::RegisterRequest* req,
                                                      v1::RegisterResponse* resp) {
  auto caller = Admit(auth_, *ctx, Method::kRegister, CheckWorkerName(req->worker()),
                      req->worker());
  if (!caller.ok()) return Refuse(ctx, caller.status());
  return Unary(ctx, coordinator_->Register(*req),
               [&](const v1::RegisterResponse& r) { *resp = r; });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Heartbeat(grpc::CallbackServerContext* ctx,
                                                       const v1::HeartbeatRequest* req,
                                                       v1::HeartbeatResponse* resp) {
  auto caller = Admit(auth_, *ctx, Method::kHeartbeat, absl::OkStatus(), req->worker());
  if (!caller.ok()) return Refuse(ctx, caller.status());
  // Finished when the coordinator replies: at once, or once a newly formed attempt
  // it hands out is stored (on the store writer's thread).
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  coordinator_->Heartbeat(*req, [reactor, resp](absl::StatusOr<v1::HeartbeatResponse> r) {
    if (r.ok()) *resp = *std::move(r);
    reactor->Finish(ToGrpcStatus(r.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ReportEvents(grpc::CallbackServerContext* ctx,
                                                          const v1::ReportEventsRequest* req,
                                                          v1::ReportEventsResponse* resp) {
  auto caller = Admit(auth_, *ctx, Method::kReportEvents, CheckReportEventsRequest(*req),
                      req->worker());
  if (!caller.ok()) return Refuse(ctx, caller.status());
  // Finished once the events are stored, on the coordinator's ingest thread.
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  coordinator_->ReportEvents(
      *req, [reactor](absl::Status st) { reactor->Finish(ToGrpcStatus(st)); });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Leave(grpc::CallbackServerContext* ctx,
                                                   const v1::LeaveRequest* req,
                                                   v1::LeaveResponse* /*resp*/) {
  auto caller = Admit(auth_, *ctx, Method::kLeave, absl::OkStatus(), req->worker());
  if (!caller.ok()) return Refuse(ctx, caller.status());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(coordinator_->Leave(*req)));  // Waits for its store commit.
  return reactor;
}

grpc::ServerUnaryReactor* WorkerServiceImpl::WaitForTasks(grpc::CallbackServerContext* ctx,
                                                          const v1::WaitForTasksRequest* req,
                                                          v1::WaitForTasksResponse* resp) {
  auto caller = Admit(auth_, *ctx, Method::kWaitForTasks, absl::OkStatus(), req->worker());
  if (!caller.ok()) return Refuse(ctx, caller.status());
  // Finished when the worker's desired state changes, at the poll's deadline (from the
  // coordinator's housekeeping), or at shutdown: on the TaskWaiters' thread.
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  coordinator_->WaitForTasks(*req, [reactor, resp](absl::StatusOr<uint64_t> version) {
    if (version.ok()) resp->set_desired_version(*version);
    reactor->Finish(ToGrpcStatus(version.status()));
  });
  return reactor;
}

}  // namespace ddp
