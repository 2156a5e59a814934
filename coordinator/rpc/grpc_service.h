// Thin gRPC adapters (callback API) over Coordinator and EventHub.
//
// Unary methods run the (non-blocking) service logic inline and finish their
// default reactor. WatchJob and StreamLogs are write reactors woken by the EventHub;
// their pulls run on the JobService's fan-out thread (never on the thread that
// ingested the change, never inside a reaction), with at most one write in flight:
// the newest state is pulled when the previous write completes.
//
// Every handler first asks the Authorizer (auth.h) who the caller is and whether the
// method admits them, and checks the request's bounds (request_limits.h); a refused
// call finishes at once with that status and never reaches the service logic.
#ifndef DDP_COORDINATOR_RPC_GRPC_SERVICE_H_
#define DDP_COORDINATOR_RPC_GRPC_SERVICE_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/rpc/auth.h"
#include "coordinator/core/coordinator.h"
#include "coordinator/core/event_hub.h"
#include "coordinator/rpc/fanout.h"
#include "coordinator/rpc/heartbeat_streams.h"
#include "ddp/v1/job_service.grpc.pb.h"
#include "ddp/v1/worker_service.grpc.pb.h"

namespace ddp {

// Bounds on open WatchJob and StreamLogs streams (--max-streams,
// --max-streams-per-caller): each holds a fan-out subscription and a connection's
// worth of buffers until its job ends or its client goes. A stream past either is
// refused with RESOURCE_EXHAUSTED naming the flag. Callers are told apart by their
// token's name; an open coordinator's anonymous callers share the total alone.
struct StreamLimits {
  int64_t total = 10000;
  int64_t per_caller = 256;
};

// Counts open streams against StreamLimits. Thread-safe.
class StreamSlots {
 public:
  explicit StreamSlots(StreamLimits limits) : limits_(limits) {}
  // OK and one more stream of `caller` counted, or RESOURCE_EXHAUSTED.
  absl::Status Acquire(const std::string& caller);
  void Release(const std::string& caller);

 private:
  const StreamLimits limits_;
  absl::Mutex mu_;
  int64_t total_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t> by_caller_ ABSL_GUARDED_BY(mu_);
};

// Owns the fan-out thread of its streams: destroy it only after the server that
// serves it has shut down.
class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  // `auth` must outlive the service.
  JobServiceImpl(Coordinator* coordinator, EventHub* hub, const Authorizer* auth,
                 StreamLimits stream_limits = StreamLimits())
      : coordinator_(coordinator), hub_(hub), auth_(auth), slots_(stream_limits) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* ctx,
                                      const v1::SubmitJobRequest* req,
                                      v1::SubmitJobResponse* resp) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx,
                                   const v1::GetJobRequest* req, v1::Job* resp) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* ctx,
                                      const v1::CancelJobRequest* req, v1::Job* resp) override;
  grpc::ServerWriteReactor<v1::Job>* WatchJob(grpc::CallbackServerContext* ctx,
                                              const v1::WatchJobRequest* req) override;
  grpc::ServerWriteReactor<v1::LogBatch>* StreamLogs(grpc::CallbackServerContext* ctx,
                                                     const v1::StreamLogsRequest* req) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* ctx,
                                        const v1::ListWorkersRequest* req,
                                        v1::ListWorkersResponse* resp) override;
  grpc::ServerUnaryReactor* CordonWorker(grpc::CallbackServerContext* ctx,
                                         const v1::CordonWorkerRequest* req,
                                         v1::Worker* resp) override;
  grpc::ServerUnaryReactor* DrainWorker(grpc::CallbackServerContext* ctx,
                                        const v1::DrainWorkerRequest* req,
                                        v1::Worker* resp) override;
  grpc::ServerUnaryReactor* UncordonWorker(grpc::CallbackServerContext* ctx,
                                           const v1::UncordonWorkerRequest* req,
                                           v1::Worker* resp) override;
  grpc::ServerUnaryReactor* RemoveWorker(grpc::CallbackServerContext* ctx,
                                         const v1::RemoveWorkerRequest* req,
                                         v1::RemoveWorkerResponse* resp) override;
  grpc::ServerUnaryReactor* CaptureStacks(grpc::CallbackServerContext* ctx,
                                          const v1::CaptureStacksRequest* req,
                                          v1::CaptureStacksResponse* resp) override;

 private:
  Coordinator* const coordinator_;
  EventHub* const hub_;
  const Authorizer* const auth_;
  StreamSlots slots_;
  FanOutExecutor fanout_;  // Runs WatchJob's and StreamLogs' pulls and writes.
};

class WorkerServiceImpl final : public WorkerServiceBase {
 public:
  // `stream_queues`: the completion queues (and threads) heartbeat streams are spread
  // over (heartbeat_streams.h).
  WorkerServiceImpl(Coordinator* coordinator, const Authorizer* auth, int stream_queues)
      : coordinator_(coordinator), auth_(auth), streams_(this, coordinator, auth, stream_queues) {}

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const v1::RegisterRequest* req,
                                     v1::RegisterResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* ReportEvents(grpc::CallbackServerContext* ctx,
                                         const v1::ReportEventsRequest* req,
                                         v1::ReportEventsResponse* resp) override;
  grpc::ServerUnaryReactor* WaitForTasks(grpc::CallbackServerContext* ctx,
                                         const v1::WaitForTasksRequest* req,
                                         v1::WaitForTasksResponse* resp) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx, const v1::LeaveRequest* req,
                                  v1::LeaveResponse* resp) override;

  // Heartbeat streams' life with the server's: their completion queues are added
  // before it is built, they are accepted once it started, closed before its Shutdown
  // (open streams would hold it to its deadline; new ones are refused) and the queues
  // drained after it.
  void AddStreamQueues(grpc::ServerBuilder& builder) { streams_.AddTo(builder); }
  void StartStreams() { streams_.Start(); }
  void CloseStreams() { streams_.Close(); }
  void StopStreams() { streams_.Stop(); }

 private:
  Coordinator* const coordinator_;
  const Authorizer* const auth_;
  HeartbeatStreams streams_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_RPC_GRPC_SERVICE_H_
