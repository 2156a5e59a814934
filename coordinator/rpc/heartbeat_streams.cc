#include "coordinator/rpc/heartbeat_streams.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rpc/status.h"

namespace ddp {

// One agent's stream: read a beat, answer it, read the next. The caller is admitted
// on the first beat (its worker name must be its own); every later beat must name the
// same worker, and the serving gate (a leader whose lease lapsed) is asked at each,
// quiet beats included: a deposed leader ends the stream, it never goes silent.
// Quiet beats (decision 161) are answered only when the answer differs from the last
// one written (its desired state, cluster id or heartbeat interval, decision 162) or
// the beat asks for it (answer_now); every answer names its beat.
class HeartbeatStreams::Stream {
 public:
  Stream(HeartbeatStreams* owner, grpc::ServerCompletionQueue* cq) : owner_(owner), cq_(cq) {
    owner_->Born();
    owner_->service_->RequestHeartbeatStream(&ctx_, &rw_, cq_, cq_, this);
  }

  // The operation in flight completed; `ok` as the queue said.
  void Proceed(bool ok) {
    switch (op_) {
      case Op::kAccept:
        if (!ok) {  // The server is shutting down.
          Delete();
          return;
        }
        owner_->Accept(cq_);  // The next stream, before anything else.
        if (!owner_->Opened(this)) {
          Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is shutting down"));
          return;
        }
        Read();
        return;
      case Op::kRead:
        if (!ok) {  // The agent closed its side, went away, or Close() cancelled it.
          Finish(grpc::Status::OK);
          return;
        }
        Beat();
        return;
      case Op::kWrite:
        if (!ok) {
          Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the heartbeat stream broke"));
          return;
        }
        Read();
        return;
      case Op::kFinish:
        Delete();
        return;
    }
  }

  void Cancel() { ctx_.TryCancel(); }

  // Out of Close()'s reach first, then deleted (its call with it), then no longer
  // counted: Stop() shuts the queues down only once nothing of it is left.
  void Delete() {
    HeartbeatStreams* owner = owner_;
    owner->Closed(this);
    delete this;
    owner->Gone();
  }

 private:
  enum class Op { kAccept, kRead, kWrite, kFinish };

  void Read() {
    op_ = Op::kRead;
    rw_.Read(&req_, this);
  }

  void Finish(const grpc::Status& status) {
    op_ = Op::kFinish;
    rw_.Finish(status, this);
  }

  void Beat() {
    absl::Status admitted;
    if (worker_.empty()) {
      admitted =
          owner_->auth_->Check(ctx_, Method::kHeartbeat, req_.worker()).status();
      worker_ = req_.worker();
    } else if (req_.worker() != worker_) {
      admitted = absl::InvalidArgumentError(absl::StrCat(
          "a heartbeat stream carries one worker's beats: this one began as ", worker_,
          ", not ", req_.worker()));
    } else {
      admitted = owner_->auth_->Gate();
    }
    if (!admitted.ok()) {
      Finish(ToGrpcStatus(admitted));
      return;
    }
    // Answered here, or later on the store writer's thread; nothing else touches the
    // stream meanwhile (no operation is in flight). A quiet beat (decision 161) whose
    // answer would repeat the last one written is not answered: the next read starts.
    const uint64_t seq = req_.beat_seq();
    const bool may_skip = req_.quiet() && !req_.answer_now();
    owner_->coordinator_->Heartbeat(
        req_, [this, seq, may_skip](absl::StatusOr<v1::HeartbeatResponse> r) {
          if (!r.ok()) {
            Finish(ToGrpcStatus(r.status()));
            return;
          }
          if (may_skip && answered_ && r->desired_version() == last_version_ &&
              r->cluster_id() == last_cluster_ &&
              r->heartbeat_interval_ms() == last_interval_ms_) {
            Read();
            return;
          }
          answered_ = true;
          last_version_ = r->desired_version();
          last_interval_ms_ = r->heartbeat_interval_ms();
          if (r->cluster_id() != last_cluster_) last_cluster_ = r->cluster_id();
          resp_ = *std::move(r);
          resp_.set_acked_seq(seq);
          op_ = Op::kWrite;
          rw_.Write(resp_, this);
        });
  }

  HeartbeatStreams* const owner_;
  grpc::ServerCompletionQueue* const cq_;
  grpc::ServerContext ctx_;
  grpc::ServerAsyncReaderWriter<v1::HeartbeatResponse, v1::HeartbeatRequest> rw_{&ctx_};
  Op op_ = Op::kAccept;
  std::string worker_;  // Named by the first beat.
  v1::HeartbeatRequest req_;
  v1::HeartbeatResponse resp_;
  // What the last answer written said: a quiet beat that would say the same is not
  // answered.
  bool answered_ = false;
  uint64_t last_version_ = 0;
  int64_t last_interval_ms_ = 0;  // A new interval (decision 162) is news.
  std::string last_cluster_;
};

HeartbeatStreams::HeartbeatStreams(WorkerServiceBase* service, Coordinator* coordinator,
                                   const Authorizer* auth, int queues)
    : service_(service), coordinator_(coordinator), auth_(auth), queues_(std::max(1, queues)) {}

HeartbeatStreams::~HeartbeatStreams() { Stop(); }

void HeartbeatStreams::AddTo(grpc::ServerBuilder& builder) {
  for (Queue& q : queues_) q.cq = builder.AddCompletionQueue();
}

void HeartbeatStreams::Start() {
  for (Queue& q : queues_) {
    Accept(q.cq.get());
    q.thread = std::thread([this, cq = q.cq.get()] { Drain(cq); });
  }
}

void HeartbeatStreams::Accept(grpc::ServerCompletionQueue* cq) { new Stream(this, cq); }

void HeartbeatStreams::Drain(grpc::ServerCompletionQueue* cq) {
  void* tag = nullptr;
  bool ok = false;
  while (cq->Next(&tag, &ok)) static_cast<Stream*>(tag)->Proceed(ok);
}

void HeartbeatStreams::Born() {
  absl::MutexLock lock(&mu_);
  ++live_;
}

bool HeartbeatStreams::Opened(Stream* stream) {
  absl::MutexLock lock(&mu_);
  if (closing_) return false;
  open_.insert(stream);
  return true;
}

void HeartbeatStreams::Closed(Stream* stream) {
  absl::MutexLock lock(&mu_);
  open_.erase(stream);
}

void HeartbeatStreams::Gone() {
  absl::MutexLock lock(&mu_);
  --live_;
}

void HeartbeatStreams::Close() {
  absl::MutexLock lock(&mu_);
  closing_ = true;
  // The pending read of each ends (ok = false) and the stream finishes; a stream
  // waiting for its answer finds its write failing, and finishes.
  for (Stream* s : open_) s->Cancel();
}

void HeartbeatStreams::Stop() {
  if (stopped_) return;
  stopped_ = true;
  {
    // A queue shut down takes no new operation (gRPC aborts the process), and a stream
    // starts one at each step until it is gone: its Finish after a failed read, a write
    // once its answer comes from the store writer. So every stream must be gone first:
    // the server's Shutdown has failed the accepts still waiting and cancelled the
    // streams Close() did not, and the queues' threads are still draining them.
    absl::MutexLock lock(&mu_);
    closing_ = true;
    mu_.Await(absl::Condition(
        +[](int* live) { return *live == 0; }, &live_));
  }
  for (Queue& q : queues_) {
    if (q.cq) q.cq->Shutdown();
  }
  for (Queue& q : queues_) {
    if (q.thread.joinable()) {
      q.thread.join();
    } else if (q.cq) {  // Never started (the server did not): nothing is in it.
      Drain(q.cq.get());
    }
  }
}

}  // namespace ddp
