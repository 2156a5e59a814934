#include "coordinator/metrics.h"

#include <limits>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "prometheus/client_metric.h"
#include "prometheus/metric_family.h"

namespace ddp {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily Family(std::string name, std::string help, MetricType type) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

void AddGauge(MetricFamily& f, std::vector<ClientMetric::Label> labels, double value) {
  ClientMetric& m = f.metric.emplace_back();
  m.label = std::move(labels);
  m.gauge.value = value;
}

void AddCounter(MetricFamily& f, std::vector<ClientMetric::Label> labels, double value) {
  ClientMetric& m = f.metric.emplace_back();
  m.label = std::move(labels);
  m.counter.value = value;
}

MetricFamily Histogram(std::string name, std::string help, const BucketHistogram& h) {
  MetricFamily f = Family(std::move(name), std::move(help), MetricType::Histogram);
  ClientMetric& m = f.metric.emplace_back();
  m.histogram.sample_count = h.count();
  m.histogram.sample_sum = h.sum();
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.counts().size(); ++i) {
    cumulative += h.counts()[i];
    ClientMetric::Bucket& b = m.histogram.bucket.emplace_back();
    b.cumulative_count = cumulative;
    b.upper_bound =
        i < h.bounds().size() ? h.bounds()[i] : std::numeric_limits<double>::infinity();
  }
  return f;
}

// Reads the coordinator when scraped.
class ScrapeView final : public prometheus::Collectable {
 public:
  explicit ScrapeView(Coordinator* coordinator) : coordinator_(coordinator) {}

  std::vector<MetricFamily> Collect() const override {
    const CoordinatorMetrics c = coordinator_->Metrics();
    std::vector<MetricFamily> out;
    MetricFamily workers = Family("ddp_workers", "Registered workers by state.", MetricType::Gauge);
    AddGauge(workers, {{"state", "alive"}}, c.workers.alive());
    AddGauge(workers, {{"state", "lost"}}, c.workers.lost());
    out.push_back(std::move(workers));
    MetricFamily busy = Family("ddp_busy_workers",
                               "Alive workers with trainers of an active attempt.",
                               MetricType::Gauge);
    AddGauge(busy, {}, c.workers.busy_workers());
    out.push_back(std::move(busy));
    MetricFamily cordoned = Family("ddp_cordoned_workers",
                                   "Registered workers an operator cordoned or is draining.",
                                   MetricType::Gauge);
    AddGauge(cordoned, {}, c.workers.cordoned());
    out.push_back(std::move(cordoned));
    MetricFamily slots =
        Family("ddp_slots", "Trainer slots of alive workers: all, and free for new trainers.",
               MetricType::Gauge);
    AddGauge(slots, {{"state", "total"}}, c.workers.slots());
    AddGauge(slots, {{"state", "free"}}, c.workers.free_slots());
    out.push_back(std::move(slots));
    MetricFamily lost = Family("ddp_worker_lost_total",
                               "Times a worker was declared lost since the coordinator started.",
                               MetricType::Counter);
    lost.metric.emplace_back().counter.value = static_cast<double>(c.workers.lost_events());
    out.push_back(std::move(lost));

    MetricFamily jobs = Family("ddp_jobs", "Jobs by state (finished ones until retention "
                               "deletes them).", MetricType::Gauge);
    for (const auto& [state, n] : c.jobs) {
      AddGauge(jobs, {{"state", absl::AsciiStrToLower(v1::JobState_Name(state))}},
               static_cast<double>(n));
    }
    out.push_back(std::move(jobs));
    MetricFamily restarts = Family("ddp_job_restarts_total",
                                   "Attempts formed to restart a job, since the coordinator "
                                   "started.", MetricType::Counter);
    restarts.metric.emplace_back().counter.value = static_cast<double>(c.job_restarts);
    out.push_back(std::move(restarts));
    MetricFamily recoveries = Family("ddp_live_recoveries_total",
                                     "Live recoveries (a failed rank replaced while the others "
                                     "kept their state), since the coordinator started: begun, "
                                     "and ended by outcome.", MetricType::Counter);
    AddCounter(recoveries, {{"outcome", "begun"}}, static_cast<double>(c.recoveries_started));
    for (const char* outcome : {"recovered", "failed"}) {
      auto it = c.recoveries_ended.find(outcome);
      AddCounter(recoveries, {{"outcome", outcome}},
                 it == c.recoveries_ended.end() ? 0.0 : static_cast<double>(it->second));
    }
    out.push_back(std::move(recoveries));
    out.push_back(Histogram("ddp_heartbeat_lag_seconds",
                            "Time between two heartbeats of a worker (the heartbeat interval "
                            "when all is well).",
                            c.heartbeat_lag));
    MetricFamily interval = Family(
        "ddp_heartbeat_interval_seconds",
        "The heartbeat interval workers are told now: --heartbeat-interval, stretched past "
        "--max-heartbeats-per-second.",
        MetricType::Gauge);
    AddGauge(interval, {}, absl::ToDoubleSeconds(c.heartbeat_interval));
    out.push_back(std::move(interval));
    MetricFamily timeout = Family(
        "ddp_heartbeat_timeout_seconds",
        "The silence after which a worker is declared lost, as workers are told now (stretched "
        "with the interval).",
        MetricType::Gauge);
    AddGauge(timeout, {}, absl::ToDoubleSeconds(c.heartbeat_timeout));
    out.push_back(std::move(timeout));
    out.push_back(Histogram("ddp_rendezvous_seconds",
                            "From an attempt's forming to its last trainer up.", c.rendezvous));

    MetricFamily sps = Family("ddp_rank_samples_per_second",
                              "A running rank's training throughput at its last step.",
                              MetricType::Gauge);
    MetricFamily loss =
        Family("ddp_rank_loss", "A running rank's training loss at its last step.",
               MetricType::Gauge);
    MetricFamily step = Family("ddp_rank_step_seconds",
                               "A running rank's time for its last step.", MetricType::Gauge);
    MetricFamily phase = Family(
        "ddp_rank_step_phase_seconds",
        "Where a running rank's last step went: phase data (waiting for batches), compute "
        "(forward and backward), communication (waiting for what computing did not hide), "
        "optimizer. Ranks that measure no phases (a step on the GPU, a program that does not "
        "say) have communication only.",
        MetricType::Gauge);
    MetricFamily global = Family("ddp_rank_global_step",
                                 "A running rank's last step, counted over epochs.",
                                 MetricType::Gauge);
    MetricFamily gpu_allocated = Family(
        "ddp_rank_gpu_memory_allocated_bytes",
        "A running rank's GPU memory held by tensors at its last step (its CUDA allocator's).",
        MetricType::Gauge);
    MetricFamily gpu_reserved = Family(
        "ddp_rank_gpu_memory_reserved_bytes",
        "A running rank's GPU memory held by its CUDA caching allocator at its last step.",
        MetricType::Gauge);
    MetricFamily gpu_peak =
        Family("ddp_rank_gpu_memory_peak_bytes",
               "The most GPU memory a running rank's tensors held so far.", MetricType::Gauge);
    MetricFamily gpu_util = Family(
        "ddp_rank_gpu_utilization_ratio",
        "A running rank's GPU busy fraction over NVML's last sample period, from its "
        "worker's last heartbeat.",
        MetricType::Gauge);
    for (const CoordinatorMetrics::Rank& r : c.ranks) {
      std::vector<ClientMetric::Label> labels = {
          {"job_id", r.job_id}, {"rank", absl::StrCat(r.rank)}, {"worker", r.worker}};
      // The worker's NVML sample, whether or not the rank has stepped yet.
      if (r.gpu_utilization_pct) AddGauge(gpu_util, labels, *r.gpu_utilization_pct / 100.0);
      if (!r.has_metrics) continue;  // No step yet: no series rather than a made-up zero.
      AddGauge(sps, labels, r.metrics.samples_per_s());
      AddGauge(loss, labels, r.metrics.loss());
      AddGauge(step, labels, r.metrics.step_ms() / 1000.0);
      auto add_phase = [&](const char* name, double ms) {
        std::vector<ClientMetric::Label> with = labels;
        with.push_back({"phase", name});
        AddGauge(phase, std::move(with), ms / 1000.0);
      };
      if (r.metrics.has_data_ms()) add_phase("data", r.metrics.data_ms());
      if (r.metrics.has_compute_ms()) add_phase("compute", r.metrics.compute_ms());
      add_phase("communication", r.metrics.comm_ms());
      if (r.metrics.has_optimizer_ms()) add_phase("optimizer", r.metrics.optimizer_ms());
      AddGauge(global, labels, static_cast<double>(r.metrics.global_step()));
      constexpr double kMiB = 1024.0 * 1024.0;
      if (r.metrics.has_gpu_memory_allocated_mib()) {
        AddGauge(gpu_allocated, labels, r.metrics.gpu_memory_allocated_mib() * kMiB);
      }
      if (r.metrics.has_gpu_memory_reserved_mib()) {
        AddGauge(gpu_reserved, labels, r.metrics.gpu_memory_reserved_mib() * kMiB);
      }
      if (r.metrics.has_gpu_memory_peak_mib()) {
        AddGauge(gpu_peak, labels, r.metrics.gpu_memory_peak_mib() * kMiB);
      }
    }
    out.push_back(std::move(sps));
    // Worker labels, as kube-state-metrics' kube_node_labels: one series per labelled
    // worker, value 1, each label as label_<key> (characters Prometheus does not allow
    // in a label name become '_'). Join with `* on(worker) group_left(label_pool)`.
    MetricFamily labelled = Family("ddp_worker_labels",
                                   "1 per registered worker with --label, its labels as "
                                   "label_<key>.",
                                   MetricType::Gauge);
    for (const auto& [worker, labels] : c.worker_labels) {
      std::vector<ClientMetric::Label> series = {{"worker", worker}};
      for (const auto& [key, value] : labels) {
        std::string name = "label_" + key;
        for (char& ch : name) {
          if (!absl::ascii_isalnum(ch) && ch != '_') ch = '_';
        }
        series.push_back({std::move(name), value});
      }
      AddGauge(labelled, std::move(series), 1);
    }
    out.push_back(std::move(labelled));
    out.push_back(std::move(loss));
    out.push_back(std::move(step));
    out.push_back(std::move(phase));
    out.push_back(std::move(global));
    // The GPU families only where some rank has a GPU: a CPU cluster's scrape stays as
    // it was.
    for (MetricFamily* f : {&gpu_allocated, &gpu_reserved, &gpu_peak, &gpu_util}) {
      if (!f->metric.empty()) out.push_back(std::move(*f));
    }
    return out;
  }

 private:
  Coordinator* const coordinator_;
};

class RpcInterceptor final : public grpc::experimental::Interceptor {
 public:
  RpcInterceptor(CoordinatorMetricsExporter* exporter, const char* method)
      : exporter_(exporter), method_(method == nullptr ? "" : method), start_(absl::Now()) {
    if (!method_.empty() && method_.front() == '/') method_.erase(0, 1);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      exporter_->RecordRpc(method_, methods->GetSendStatus().error_code(),
                           absl::ToDoubleSeconds(absl::Now() - start_));
    }
    methods->Proceed();
  }

 private:
  CoordinatorMetricsExporter* const exporter_;
  std::string method_;
  const absl::Time start_;
};

class RpcInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcInterceptorFactory(CoordinatorMetricsExporter* exporter) : exporter_(exporter) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new RpcInterceptor(exporter_, info->method());
  }

 private:
  CoordinatorMetricsExporter* const exporter_;
};

}  // namespace

const char* StatusCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    default: return "UNKNOWN";
  }
}

CoordinatorMetricsExporter::CoordinatorMetricsExporter(Coordinator* coordinator)
    : scrape_view_(std::make_shared<ScrapeView>(coordinator)),
      registry_(std::make_shared<prometheus::Registry>()),
      rpc_requests_(&prometheus::BuildCounter()
                         .Name("ddp_rpc_requests_total")
                         .Help("gRPC calls the coordinator answered, by method and status code.")
                         .Register(*registry_)),
      rpc_seconds_(&prometheus::BuildHistogram()
                        .Name("ddp_rpc_duration_seconds")
                        .Help("How long the coordinator's gRPC calls took (streams: how long "
                              "they were open), by method and status code.")
                        .Register(*registry_)) {}

std::vector<std::weak_ptr<prometheus::Collectable>> CoordinatorMetricsExporter::collectables()
    const {
  return {scrape_view_, registry_};
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
CoordinatorMetricsExporter::InterceptorFactory() {
  return std::make_unique<RpcInterceptorFactory>(this);
}

void CoordinatorMetricsExporter::RecordRpc(const std::string& method, grpc::StatusCode code,
                                           double seconds) {
  const prometheus::Labels labels = {{"method", method}, {"code", StatusCodeName(code)}};
  rpc_requests_->Add(labels).Increment();
  static const auto* const kBounds = new prometheus::Histogram::BucketBoundaries{
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30, 300};
  rpc_seconds_->Add(labels, *kBounds).Observe(seconds);
}

}  // namespace ddp
