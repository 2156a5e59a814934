// ddp-trainer's events: the one definition of the contract between the trainer, the
// worker agent and the coordinator.
//
// Each event type is a struct here, and its static Fields() lists every field once:
// JSON name, member, and the note docs/trainer.md shows. Everything else is derived
// from that list by visitors:
//   - the trainer's serializer (EventSink::Emit: one JSON object per line on the
//     descriptor named by DDP_EVENTS_FD, or stdout; the format in docs/trainer.md),
//   - the agent's parser (worker/agent/trainer_event_parser.h), which checks a line
//     field by field (unknown and missing fields are reported, not ignored) and maps
//     it into v1::TrainerEvent by field name, so the proto relays a subset of these
//     fields with the same names,
//   - the events table in docs/trainer.md (EventsMarkdownTable(); a test compares).
// Every event also carries the envelope: "type", "rank" and "time" (Unix seconds).
//
// A field is one of: int64_t, double (NaN is written as null), bool, std::string,
// std::optional<double> (null when absent), std::optional<S> or std::vector<S> of a
// struct S that has Fields() itself. No LibTorch and no protobuf here.
#ifndef DDP_COMMON_CONTRACT_EVENTS_H_
#define DDP_COMMON_CONTRACT_EVENTS_H_

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/json_writer.h"

namespace ddp {

// Where training stands: `step` optimizer steps of `epoch` are done.
struct PositionField {
  int64_t epoch = 0;
  int64_t step = 0;
  int64_t global_step = 0;
  template <typename S, typename V>
  static void Fields(S& s, V&& v) {
    v("epoch", s.epoch, "");
    v("step", s.step, "");
    v("global_step", s.global_step, "");
  }
};

struct BucketField {
  int64_t index = 0;
  int64_t params = 0;
  int64_t numel = 0;
  int64_t bytes = 0;
  template <typename S, typename V>
  static void Fields(S& s, V&& v) {
    v("index", s.index, "");
    v("params", s.params, "");
    v("numel", s.numel, "");
    v("bytes", s.bytes, "");
  }
};

struct TraceEntryField {
  std::string kind;
  int64_t index = 0;
  double us = 0;
  template <typename S, typename V>
  static void Fields(S& s, V&& v) {
    v("kind", s.kind, "");
    v("index", s.index, "");
    v("us", s.us, "");
  }
};

struct StartEvent {
  static constexpr char kType[] = "start";
  static constexpr char kFrom[] = "every rank";
  int64_t world_size = 0;
  int64_t local_rank = 0;
  int64_t group_rank = 0;
  std::string backend;
  std::string intra_node_comm;
  std::string device;
  std::string precision;
  std::string model;
  int64_t params = 0;
  int64_t train_samples = 0;
  int64_t val_samples = 0;
  int64_t batch_size = 0;
  int64_t steps_per_epoch = 0;
  int64_t epochs = 0;
  int64_t threads = 0;
  std::optional<PositionField> resumed_from;
  template <typename S, typename V>
  static void Fields(S& s, V&& v) {
    v("world_size", s.world_size, "");
    v("local_rank", s.local_rank, "");
    v("group_rank", s.group_rank, "");
    v("backend", s.backend, "");
    v("intra_node_comm", s.intra_node_comm,
      "`shm`, or the backend's name: see [Communication](#communication)");
    v("device", s.device, "");
    v("precision", s.precision, "`fp32`, or `bf16`: autocast with fp32 master weights");
    v("model", s.model, "");
    v("params", s.params, "");
    v("train_samples", s.train_samples, "");
    v("val_samples", s.val_samples, "");
    v("batch_size", s.batch_size, "");
    v("steps_per_epoch", s.steps_per_epoch, "");
    v("epochs", s.epochs, "");
    v("threads", s.threads, "");
    v("resumed_from", s.resumed_from, "the checkpoint's position, null when starting fresh");
  }
};

struct BucketsEvent {
  static constexpr char kType[] = "buckets";
  static constexpr char kFrom[] = "rank 0";
  double cap_mb = 0;
  std::vector<BucketField> buckets;
  template <typename S, typename V>
  static void Fields(S& s, V&& v) {
    v("cap_mb", s.cap_mb, "");
    v("buckets", s.buckets, "");
  }
};

struct StepEvent {
  static constexpr char kType[] = "step";
  static constexpr char kFrom[] =
      "every rank, every `metrics.every_steps` steps and the last of each epoch";
  int64_t epoch = 0;
  int64_t step = 0;
  int64_t steps = 0;
  int64_t global_step = 0;
  double loss = 0;
  double samples_per_s = 0;
  double step_ms = 0;
  double comm_ms = 0;
  double lr = 0;
  // The rank's GPU, as its CUDA caching allocator sees it (null on the CPU).
  std::optional<double> gpu_memory_allocated_mib;
  std::optional<double> gpu_memory_reserved_mib;
  std::optional<double> gpu_memory_peak_mib;
  // Where the step's time went (null where not measured: a step queued on the GPU).
  std::optional<double> data_ms;
  std::optional<double> compute_ms;
  std::optional<double> optimizer_ms;
  template <typename S, typename V>
  static void Fields(S& s, V&& v) {
    v("epoch", s.epoch, "");
    v("step", s.step, "0-based in the epoch");
    v("steps", s.steps, "per epoch");
    v("global_step", s.global_step, "");
    v("loss", s.loss, "this rank's, mean over its micro-batches");
    v("samples_per_s", s.samples_per_s, "this rank, since its previous step event");
    v("step_ms", s.step_ms, "");
    v("comm_ms", s.comm_ms, "waiting for communication that computing did not hide");
    v("lr", s.lr, "");
    v("gpu_memory_allocated_mib", s.gpu_memory_allocated_mib,
      "held by tensors now, as `torch.cuda.memory_allocated`; null on the CPU");
    v("gpu_memory_reserved_mib", s.gpu_memory_reserved_mib,
      "held by the caching allocator, as `memory_reserved`; null on the CPU");
    v("gpu_memory_peak_mib", s.gpu_memory_peak_mib,
      "the most held by tensors so far, as `max_memory_allocated`; null on the CPU");
    v("data_ms", s.data_ms, "of step_ms, gathering the step's batches; null on the GPU");
    v("compute_ms", s.compute_ms,
      "of step_ms, forward and backward less comm_ms; null on the GPU");
    v("optimizer_ms", s.optimizer_ms, "of step_ms, clipping and the optimizer; null on the GPU");
  }
};

struct TraceEvent {
  static constexpr char kType[] = "trace";
  static constexpr char kFrom[] = "every rank, each step, with `metrics.trace_buckets`";
  int64_t epoch = 0;
  int64_t global_step = 0;
  std::string params_fingerprint;
  std::vector<TraceEntryField> entries;
  template <typename S, typename V>
  static void Fields(S& s, V&& v) {
    v("epoch", s.epoch, "");
    v("global_step", s.global_step, "");
    v("params_fingerprint", s.params_fingerprint,
      "of the parameters after this step: equal on every rank, step by step");
    v("entries", s.entries,
      "kinds `grad_ready`, `allreduce_launch`, `backward_end`, `allreduce_done`");
  }
};

struct EpochEvent {
  static constexpr char kType[] = "epoch";
  static constexpr char kFrom[] = "rank 0";
  int64_t epoch = 0;
  double train_loss = 0;
  std::optional<double> val_loss;
  std::optional<double> val_accuracy;
  int64_t val_samples = 0;
  double validate_ms = 0;
  template <typename S, typename V>
  static void Fields(S& s, V&& v) {
    v("epoch", s.epoch, "");
    v("train_loss", s.train_loss, "mean over all ranks' steps");
    v("val_loss", s.val_loss, "null without validation");
    v("val_accuracy", s.val_accuracy, "null without validation and for mse");
    v("val_samples", s.val_samples, "");
    v("validate_ms", s.validate_ms, "");
  }
};

struct CheckpointEvent {
  static constexpr char kType[] = "checkpoint";
  static constexpr char kFrom[] = "rank 0";
  std::string path;
  int64_t epoch = 0;
  int64_t step = 0;
  int64_t global_step = 0;
  double write_ms = 0;
  bool async = false;
  double snapshot_ms = 0;
  double wait_ms = 0;
  template <typename S, typename V>
  static void Fields(S& s, V&& v) {
    v("path", s.path, "");
    v("epoch", s.epoch, "");
    v("step", s.step, "");
    v("global_step", s.global_step, "");
    v("write_ms", s.write_ms, "serializing and writing the file, fsync and rename included");
    v("async", s.async, "true: written in the background while training went on (checkpoint.async)");
    v("snapshot_ms", s.snapshot_ms,
      "async: what training waited for the state's copy into host memory");
    v("wait_ms", s.wait_ms,
      "async: what training waited for the save before it, still in flight");
  }
};

struct DoneEvent {
  static constexpr char kType[] = "done";
  static constexpr char kFrom[] = "every rank";
  int64_t epochs = 0;
  int64_t global_step = 0;
  std::string params_fingerprint;
  int64_t samples = 0;
  double train_s = 0;
  std::optional<double> val_accuracy;
  template <typename S, typename V>
  static void Fields(S& s, V&& v) {
    v("epochs", s.epochs, "");
    v("global_step", s.global_step, "");
    v("params_fingerprint", s.params_fingerprint,
      "FNV-1a of the parameters: equal on all ranks");
    v("samples", s.samples, "");
    v("train_s", s.train_s, "");
    v("val_accuracy", s.val_accuracy, "of the last validation; null without one");
  }
};

struct ErrorEvent {
  static constexpr char kType[] = "error";
  static constexpr char kFrom[] = "the failing rank";
  std::string message;
  bool retryable = false;
  bool node_fault = false;
  template <typename S, typename V>
  static void Fields(S& s, V&& v) {
    v("message", s.message, "");
    v("retryable", s.retryable, "false for exit 2");
    v("node_fault", s.node_fault, "true for exit 3");
  }
};

struct RecoveredEvent {
  static constexpr char kType[] = "recovered";
  static constexpr char kFrom[] = "rank 0";
  int64_t generation = 0;
  int64_t source_rank = 0;
  int64_t global_step = 0;
  double wait_ms = 0;
  double sync_ms = 0;
  template <typename S, typename V>
  static void Fields(S& s, V&& v) {
    v("generation", s.generation, "the attempt's live-recovery generation now formed");
    v("source_rank", s.source_rank, "the rank whose state every rank took");
    v("global_step", s.global_step, "optimizer steps of that state");
    v("wait_ms", s.wait_ms, "from the failed collective to the news of the replacement");
    v("sync_ms", s.sync_ms, "forming the new process group and the state transfer");
  }
};

// Every event type, in the order docs/trainer.md lists them.
using AllEventTypes = std::tuple<StartEvent, BucketsEvent, StepEvent, TraceEvent, EpochEvent,
                                 CheckpointEvent, DoneEvent, ErrorEvent, RecoveredEvent>;

// Calls fn(E{}) once per event type, in that order.
template <typename Fn>
void ForEachEventType(Fn&& fn) {
  std::apply([&](auto... e) { (fn(e), ...); }, AllEventTypes{});
}

namespace events_internal {

// Writes fields into a JsonObject (the trainer's serializer).
class JsonFieldWriter {
 public:
  explicit JsonFieldWriter(JsonObject* out) : out_(out) {}
  void operator()(const char* name, const int64_t& v, const char*) { out_->Add(name, v); }
  void operator()(const char* name, const double& v, const char*) { out_->Add(name, v); }
  void operator()(const char* name, const bool& v, const char*) { out_->Add(name, v); }
  void operator()(const char* name, const std::string& v, const char*) { out_->Add(name, v); }
  void operator()(const char* name, const std::optional<double>& v, const char*) {
    if (v.has_value()) {
      out_->Add(name, *v);
    } else {
      out_->AddNull(name);
    }
  }
  template <typename S>
  void operator()(const char* name, const std::optional<S>& v, const char*) {
    if (v.has_value()) {
      out_->AddRaw(name, ToJson(*v));
    } else {
      out_->AddNull(name);
    }
  }
  template <typename S>
  void operator()(const char* name, const std::vector<S>& v, const char*) {
    std::vector<std::string> items;
    items.reserve(v.size());
    for (const S& item : v) items.push_back(ToJson(item));
    out_->AddRaw(name, JsonArray(items));
  }

  template <typename S>
  static std::string ToJson(const S& s) {
    JsonObject o;
    S::Fields(s, JsonFieldWriter(&o));
    return o.str();
  }

 private:
  JsonObject* out_;
};

}  // namespace events_internal

// One event as a JSON line (with its newline), envelope first.
template <typename E>
std::string EventLine(const E& event, int64_t rank, double time) {
  JsonObject o;
  o.Add("type", E::kType).Add("rank", rank).Add("time", time);
  E::Fields(event, events_internal::JsonFieldWriter(&o));
  return o.Line();
}

// The events table of docs/trainer.md, rendered from the definitions above: one row
// per type with its fields (nested ones as `{a, b}` or `[{a, b}]`) and their notes.
std::string EventsMarkdownTable();

class EventSink {
 public:
  // `fd` < 0 means stdout. The sink does not own the descriptor.
  EventSink(int fd, int rank);

  // Writes one event line; safe from any thread. A closed reader (EPIPE) turns the
  // sink off rather than killing the trainer.
  template <typename E>
  void Emit(const E& event) {
    Write(EventLine(event, rank_, NowSeconds()));
  }

 private:
  static double NowSeconds();
  void Write(const std::string& line);

  int fd_;
  int rank_;
  std::mutex mu_;
  bool broken_ = false;
};

}  // namespace ddp

#endif  // DDP_COMMON_CONTRACT_EVENTS_H_
