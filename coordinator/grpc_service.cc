#include "coordinator/grpc_service.h"

#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/status.h"

namespace ddp {
namespace {

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
// The hub holds a shared Link; Notify() wakes the stream unless it is done. Each
// wake marks the stream dirty; when no write is in flight, the stream pulls its next
// message (Next()) and writes it. Finishing is decided under the lock and done after
// releasing it, as is every StartWrite, so no reaction ever runs under our lock.
template <typename Message>
class HubStream : public grpc::ServerWriteReactor<Message> {
 public:
  HubStream(EventHub* hub, std::string job_id) : hub_(hub), job_id_(std::move(job_id)) {}

  void Start() {
    link_ = std::make_shared<Link>(this);
    hub_->Subscribe(job_id_, link_);
    Wake();
  }

  void OnWriteDone(bool ok) override {
    Action action;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) cancelled_ = true;
      action = DecideLocked();
    }
    Act(action);
  }

  void OnCancel() override {
    Action action;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      action = DecideLocked();
    }
    Act(action);
  }

  void OnDone() override {
    link_->Detach();
    hub_->Unsubscribe(job_id_, link_.get());
    delete this;
  }

 protected:
  // The next message to send, or nullopt when there is nothing new. Sets `*last`
  // when the stream ends after it (`*status` is then sent), `*more` when another
  // message is ready right after this one. Runs under the stream's lock: it must not
  // call back into the hub's notifications.
  virtual std::optional<Message> Next(bool* last, bool* more, grpc::Status* status) = 0;

 private:
  struct Link : EventHub::Listener {
    explicit Link(HubStream* s) : stream(s) {}
    void Notify() override {
      absl::MutexLock lock(&mu);
      if (stream != nullptr) stream->Wake();
    }
    void Detach() {
      absl::MutexLock lock(&mu);
      stream = nullptr;
    }
    absl::Mutex mu;
    HubStream* stream ABSL_GUARDED_BY(mu);
  };

  enum class Action { kNone, kWrite, kFinish };

  void Wake() {
    Action action;
    {
      absl::MutexLock lock(&mu_);
      dirty_ = true;
      action = DecideLocked();
    }
    Act(action);
  }

  Action DecideLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || writing_) return Action::kNone;
    if (cancelled_) {
      finished_ = true;
      status_ = grpc::Status::CANCELLED;
      return Action::kFinish;
    }
    if (ending_) {
      finished_ = true;
      return Action::kFinish;
    }
    if (!dirty_) return Action::kNone;
    dirty_ = false;
    bool last = false, more = false;
    std::optional<Message> next = Next(&last, &more, &status_);
    if (last) ending_ = true;
    if (more) dirty_ = true;
    if (next.has_value()) {
      message_ = std::move(*next);
      writing_ = true;
      return Action::kWrite;
    }
    if (ending_) {
      finished_ = true;
      return Action::kFinish;
    }
    return Action::kNone;
  }

  void Act(Action action) {
    if (action == Action::kWrite) {
      this->StartWrite(&message_);  // message_ is ours alone until OnWriteDone.
    } else if (action == Action::kFinish) {
      this->Finish(status_);
    }
  }

  EventHub* const hub_;
  const std::string job_id_;
  std::shared_ptr<Link> link_;
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
  JobWatch(Coordinator* coordinator, EventHub* hub, std::string job_id)
      : HubStream(hub, job_id), coordinator_(coordinator), job_id_(std::move(job_id)) {}

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
  LogStream(Coordinator* coordinator, EventHub* hub, const v1::StreamLogsRequest& req)
      : HubStream(hub, req.job_id()), coordinator_(coordinator), hub_(hub), req_(req),
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

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* ctx,
                                                    const v1::SubmitJobRequest* req,
                                                    v1::SubmitJobResponse* resp) {
  return Unary(ctx, coordinator_->Submit(*req), [&](const v1::Job& job) {
    resp->set_job_id(job.id());
    *resp->mutable_job() = job;
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* ctx,
                                                 const v1::GetJobRequest* req, v1::Job* resp) {
  return Unary(ctx, coordinator_->GetJob(req->job_id(), req->metric_history()),
               [&](const v1::Job& job) { *resp = job; });
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* ctx,
                                                   const v1::ListJobsRequest* req,
                                                   v1::ListJobsResponse* resp) {
  for (auto& job : coordinator_->ListJobs(req->limit())) *resp->add_jobs() = std::move(job);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* ctx,
                                                    const v1::CancelJobRequest* req,
                                                    v1::Job* resp) {
  return Unary(ctx, coordinator_->Cancel(req->job_id()), [&](const v1::Job& job) { *resp = job; });
}

grpc::ServerWriteReactor<v1::Job>* JobServiceImpl::WatchJob(grpc::CallbackServerContext* ctx,
                                                            const v1::WatchJobRequest* req) {
  auto* watch = new JobWatch(coordinator_, hub_, req->job_id());
  watch->Start();
  return watch;
}

grpc::ServerWriteReactor<v1::LogBatch>* JobServiceImpl::StreamLogs(
    grpc::CallbackServerContext* ctx, const v1::StreamLogsRequest* req) {
  v1::StreamLogsRequest effective = *req;
  if (req->tail() > 0) {
    std::optional<int> rank;
    if (req->has_rank()) rank = req->rank();
    effective.set_after_seq(
        std::max(req->after_seq(), hub_->TailStart(req->job_id(), rank, req->tail())));
  }
  auto* stream = new LogStream(coordinator_, hub_, effective);
  stream->Start();
  return stream;
}

grpc::ServerUnaryReactor* JobServiceImpl::ListWorkers(grpc::CallbackServerContext* ctx,
                                                      const v1::ListWorkersRequest* req,
                                                      v1::ListWorkersResponse* resp) {
  for (auto& w : coordinator_->ListWorkers()) *resp->add_workers() = std::move(w);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Register(grpc::CallbackServerContext* ctx,
                                                      const v1::RegisterRequest* req,
                                                      v1::RegisterResponse* resp) {
  return Unary(ctx, coordinator_->Register(*req),
               [&](const v1::RegisterResponse& r) { *resp = r; });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Heartbeat(grpc::CallbackServerContext* ctx,
                                                       const v1::HeartbeatRequest* req,
                                                       v1::HeartbeatResponse* resp) {
  return Unary(ctx, coordinator_->Heartbeat(*req),
               [&](const v1::HeartbeatResponse& r) { *resp = r; });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ReportEvents(grpc::CallbackServerContext* ctx,
                                                          const v1::ReportEventsRequest* req,
                                                          v1::ReportEventsResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(coordinator_->ReportEvents(*req)));
  return reactor;
}

}  // namespace ddp
