#include "worker/agent/agent_metrics.h"

#include <string>
#include <utility>
#include <vector>

#include "prometheus/client_metric.h"
#include "prometheus/metric_family.h"

namespace ddp {
namespace {

using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily One(std::string name, std::string help, MetricType type, int64_t value) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  prometheus::ClientMetric& m = f.metric.emplace_back();
  (type == MetricType::Counter ? m.counter.value : m.gauge.value) = static_cast<double>(value);
  return f;
}

class AgentMetrics final : public prometheus::Collectable {
 public:
  explicit AgentMetrics(const Agent* agent) : agent_(agent) {}

  std::vector<MetricFamily> Collect() const override {
    const Agent::Stats s = agent_->stats();
    return {
        One("ddp_worker_trainers", "Trainer processes running on this node.", MetricType::Gauge,
            s.trainers_running),
        One("ddp_worker_trainers_started_total", "Trainer processes this agent spawned.",
            MetricType::Counter, s.trainers_started),
        One("ddp_worker_tasks_started_total",
            "Tasks (one attempt's ranks on this node) this agent started.", MetricType::Counter,
            s.tasks_started),
        One("ddp_worker_task_restarts_total",
            "Tasks started for a job's restart (attempt 2 and later).", MetricType::Counter,
            s.restarted_tasks),
        One("ddp_worker_task_start_failures_total", "Tasks that could not start.",
            MetricType::Counter, s.start_failures),
        One("ddp_worker_output_dropped_total",
            "Output lines and events dropped because the outbox to the coordinator was full.",
            MetricType::Counter, s.events_dropped),
        One("ddp_worker_heartbeat_failures_total", "Heartbeats that failed.",
            MetricType::Counter, s.heartbeat_failures),
        One("ddp_worker_malformed_event_lines_total",
            "Lines on DDP_EVENTS_FD from users' programs that were not events (ignored).",
            MetricType::Counter, s.malformed_event_lines),
        One("ddp_worker_fences_total",
            "Times this worker, cut off from the coordinator while other workers reached it "
            "(or none answered), killed its ranks.",
            MetricType::Counter, s.fences),
    };
  }

 private:
  const Agent* const agent_;
};

}  // namespace

std::shared_ptr<prometheus::Collectable> MakeAgentMetrics(const Agent* agent) {
  return std::make_shared<AgentMetrics>(agent);
}

}  // namespace ddp
