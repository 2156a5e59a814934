// Thin gRPC adapters (callback API) over Coordinator and EventHub.
//
// Unary methods run the (non-blocking) service logic inline and finish their
// default reactor. WatchJob and StreamLogs are write reactors woken by the EventHub;
// their pulls run on the JobService's fan-out thread (never on the thread that
// ingested the change, never inside a reaction), with at most one write in flight:
// the newest state is pulled when the previous write completes.
#ifndef DDP_COORDINATOR_GRPC_SERVICE_H_
#define DDP_COORDINATOR_GRPC_SERVICE_H_

#include "coordinator/coordinator.h"
#include "coordinator/event_hub.h"
#include "coordinator/fanout.h"
#include "ddp/v1/job_service.grpc.pb.h"
#include "ddp/v1/worker_service.grpc.pb.h"

namespace ddp {

// Owns the fan-out thread of its streams: destroy it only after the server that
// serves it has shut down.
class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  JobServiceImpl(Coordinator* coordinator, EventHub* hub)
      : coordinator_(coordinator), hub_(hub) {}

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

 private:
  Coordinator* const coordinator_;
  EventHub* const hub_;
  FanOutExecutor fanout_;  // Runs WatchJob's and StreamLogs' pulls and writes.
};

class WorkerServiceImpl final : public v1::WorkerService::CallbackService {
 public:
  explicit WorkerServiceImpl(Coordinator* coordinator) : coordinator_(coordinator) {}

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const v1::RegisterRequest* req,
                                     v1::RegisterResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* ReportEvents(grpc::CallbackServerContext* ctx,
                                         const v1::ReportEventsRequest* req,
                                         v1::ReportEventsResponse* resp) override;

 private:
  Coordinator* const coordinator_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_GRPC_SERVICE_H_
