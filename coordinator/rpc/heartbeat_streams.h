// WorkerService.HeartbeatStream on gRPC's asynchronous (completion-queue) API, its
// streams spread over a few completion queues, each drained by a thread of its own.
//
// Why not the callback API, as every other method: a stream keeps two operations
// outstanding on its completion queue between beats (the read waiting for the next
// beat, and the call's completion), and the gRPC that Debian ships is built without
// NDEBUG, so every operation that completes is looked up in a list of all the queue's
// outstanding ones (completion_queue.cc's cq_check_tag), under the queue's lock. On
// the callback API there is one such queue per server: at 10,000 agents every beat
// scanned some 20,000 entries twice, a third of the coordinator's CPU, and the two
// threads draining it queued on its lock (docs/benchmarks.md). Here each queue holds
// 1/N of the streams.
//
// Each stream has at most one operation in flight (accept, read, write or finish), so
// the stream itself is the tag. A beat is answered as WorkerService.Heartbeat answers
// it; the answer may come from another thread (the store writer, once an attempt it
// hands out is stored), which then starts the write. A quiet beat (decision 161) whose
// answer would repeat the last one written, and that does not ask for one, is not
// answered: the next read starts instead of the write.
#ifndef DDP_COORDINATOR_RPC_HEARTBEAT_STREAMS_H_
#define DDP_COORDINATOR_RPC_HEARTBEAT_STREAMS_H_

#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/core/coordinator.h"
#include "coordinator/rpc/auth.h"
#include "ddp/v1/worker_service.grpc.pb.h"
#include "grpcpp/server_builder.h"

namespace ddp {

// WorkerService with HeartbeatStream on the asynchronous API, the rest on callbacks.
using WorkerServiceBase = v1::WorkerService::WithCallbackMethod_Register<
    v1::WorkerService::WithCallbackMethod_Heartbeat<
        v1::WorkerService::WithAsyncMethod_HeartbeatStream<
            v1::WorkerService::WithCallbackMethod_ReportEvents<
                v1::WorkerService::WithCallbackMethod_WaitForTasks<
                    v1::WorkerService::WithCallbackMethod_Leave<v1::WorkerService::Service>>>>>>;

class HeartbeatStreams {
 public:
  // `queues` completion queues, each drained by one thread (at least 1).
  HeartbeatStreams(WorkerServiceBase* service, Coordinator* coordinator, const Authorizer* auth,
                   int queues);
  ~HeartbeatStreams();  // Stop(), if not yet.
  HeartbeatStreams(const HeartbeatStreams&) = delete;
  HeartbeatStreams& operator=(const HeartbeatStreams&) = delete;

  // Before the server is built: its completion queues.
  void AddTo(grpc::ServerBuilder& builder);
  // Once the server is started: accepts streams.
  void Start();
  // Ends every open stream (UNAVAILABLE "the coordinator is shutting down" for those
  // that open from now on): before the server's Shutdown, which would otherwise wait
  // for them until its deadline.
  void Close();
  // After the server's Shutdown has returned: waits until every stream is gone (the
  // queues' threads finish them), then shuts the queues down, drains them and joins
  // their threads.
  void Stop();

  class Stream;

 private:
  struct Queue {
    std::unique_ptr<grpc::ServerCompletionQueue> cq;
    std::thread thread;
  };
  void Accept(grpc::ServerCompletionQueue* cq);
  void Drain(grpc::ServerCompletionQueue* cq);
  // Every Stream, from its first operation (the accept) to its deletion: Stop() waits
  // for none to be left before it shuts the queues down.
  void Born();
  void Gone();
  // An accepted stream, for Close(); false when closing (the stream is refused).
  bool Opened(Stream* stream);
  void Closed(Stream* stream);

  WorkerServiceBase* const service_;
  Coordinator* const coordinator_;
  const Authorizer* const auth_;
  std::vector<Queue> queues_;
  bool stopped_ = false;
  absl::Mutex mu_;
  std::set<Stream*> open_ ABSL_GUARDED_BY(mu_);
  int live_ ABSL_GUARDED_BY(mu_) = 0;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_RPC_HEARTBEAT_STREAMS_H_
