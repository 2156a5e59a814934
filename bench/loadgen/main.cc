// ddp-loadgen: simulated node agents against a real ddp-coordinator, to measure the
// control plane at cluster scale. Flags are parsed here and nowhere else.
//
//   # 10,000 idle agents at 1 Hz, one TCP connection each, 60 s measured:
//   ddp-loadgen --agents 10000 --duration 60s --coordinator-pid $(pidof ddp-coordinator)
//   # ... with a job queued that no node can hold (2 ranks per node, 1-slot agents):
//   ddp-loadgen --agents 10000 --job-nodes 2 --job-slots 2 --duration 60s --coordinator-pid ...
//   # a job on 1,024 simulated nodes with fake trainers, submitted before they join:
//   ddp-loadgen --agents 1024 --job-nodes 1024 --submit-first --fake-trainers
//       --train-time 10s --step-every 1s
//
// It reports what it achieved (heartbeats per second against the target, latency
// percentiles, errors, beats it had to skip), the coordinator's CPU (utime + stime
// from /proc over the window, not wall clock) and RSS, and for a job: how long after
// the last agent joined every agent held its task, and how long after the last
// trainer was reported up the job showed RUNNING, then its outcome.
//
// Exit codes: 0 done; 1 the coordinator failed us (registration, submission); 2 bad
// flags.
#include <sys/resource.h>

#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/loadgen/proc_stats.h"
#include "bench/loadgen/sim_cluster.h"
#include "common/flags.h"
#include "common/json_writer.h"
#include "ddp/v1/job_service.grpc.pb.h"

namespace ddp::loadgen {
namespace {

struct Options {
  SimOptions sim;
  absl::Duration warmup = absl::Seconds(15);
  absl::Duration duration = absl::Seconds(60);
  int64_t coordinator_pid = 0;
  int job_nodes = 0;
  int job_slots = 0;  // The job's nproc_per_node (0: the agents' --slots).
  bool submit_first = false;
  absl::Duration job_timeout = absl::Minutes(10);
  absl::Duration poll = absl::Milliseconds(20);
  std::string json;
};

// When a job was first seen in each phase (polled every `poll` until RUNNING).
struct JobTimeline {
  std::string id;
  absl::Time submitted;
  std::optional<absl::Time> formed, running, finished;
  std::string outcome;  // Terminal state name and reason.
  int world_size = 0;
};

std::string JobYaml(int nodes, int slots) {
  return absl::StrCat("name: loadgen\nnodes: ", nodes, "\nnproc_per_node: ", slots,
                      "\nmax_restarts: 0\nrdzv: {timeout_s: 120}\nmodel: {mlp: {}}\n"
                      "data: {synthetic: {}}\ntrain: {batch_size: 4, epochs: 1}\n");
}

class JobProbe {
 public:
  JobProbe(v1::JobService::Stub* stub, absl::Duration poll) : stub_(stub), poll_(poll) {}
  ~JobProbe() { Stop(); }

  absl::Status Submit(int nodes, int slots) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::SubmitJobRequest req;
    req.set_spec_yaml(JobYaml(nodes, slots));
    req.set_workdir("/");
    req.set_source_name("loadgen.yaml");
    v1::SubmitJobResponse resp;
    grpc::Status st = stub_->SubmitJob(&ctx, req, &resp);
    if (!st.ok()) return absl::UnavailableError("submit: " + st.error_message());
    absl::MutexLock lock(&mu_);
    timeline_.id = resp.job_id();
    timeline_.submitted = absl::Now();
    thread_ = std::thread([this] { Loop(); });
    return absl::OkStatus();
  }

  // Waits until the job ends or `timeout` passes.
  bool WaitFinished(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return timeline_.finished.has_value();
    };
    return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  }

  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

  JobTimeline timeline() {
    absl::MutexLock lock(&mu_);
    return timeline_;
  }

 private:
  void Loop() {
    while (true) {
      absl::Duration wait;
      std::string id;
      {
        absl::MutexLock lock(&mu_);
        if (stop_ || timeline_.finished.has_value()) return;
        id = timeline_.id;
        wait = timeline_.running.has_value() ? absl::Milliseconds(500) : poll_;
      }
      // ListJobs, not GetJob: the summary without every rank's metrics, so that
      // polling a 4,096-rank job does not load the coordinator it measures.
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
      v1::ListJobsRequest req;
      req.set_limit(1);  // Ours is the newest.
      v1::ListJobsResponse resp;
      const bool ok = stub_->ListJobs(&ctx, req, &resp).ok() && resp.jobs_size() == 1 &&
                      resp.jobs(0).id() == id;
      const absl::Time now = absl::Now();
      if (ok) {
        const v1::Job& job = resp.jobs(0);
        absl::MutexLock lock(&mu_);
        if (!job.attempts().empty() && !timeline_.formed) {
          timeline_.formed = now;
          timeline_.world_size = job.attempts(0).world_size();
        }
        if (job.state() == v1::RUNNING && !timeline_.running) timeline_.running = now;
        if (job.state() == v1::SUCCEEDED || job.state() == v1::FAILED ||
            job.state() == v1::CANCELLED) {
          timeline_.finished = now;
          timeline_.outcome = absl::StrCat(v1::JobState_Name(job.state()), ": ", job.reason());
        }
      }
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), wait);
    }
  }

  v1::JobService::Stub* const stub_;
  const absl::Duration poll_;
  absl::Mutex mu_;
  JobTimeline timeline_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

std::optional<v1::WorkerSummary> Summary(v1::JobService::Stub* stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::ListWorkersRequest req;
  req.set_summary_only(true);
  v1::ListWorkersResponse resp;
  if (!stub->ListWorkers(&ctx, req, &resp).ok()) return std::nullopt;
  return resp.summary();
}

double SelfCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

std::string Seconds(absl::Duration d) { return absl::StrFormat("%.3f", absl::ToDoubleSeconds(d)); }

int Run(const Options& o) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  auto jobs = v1::JobService::NewStub(
      grpc::CreateCustomChannel(o.sim.coordinator, grpc::InsecureChannelCredentials(), args));
  std::optional<ProcSample> baseline;
  if (o.coordinator_pid > 0) {
    auto s = SampleProcess(static_cast<pid_t>(o.coordinator_pid));
    if (!s.ok()) {
      std::cerr << "ddp-loadgen: --coordinator-pid: " << s.status().message() << "\n";
      return 2;
    }
    baseline = *s;
  }
  SimCluster sim(o.sim);
  JobProbe probe(jobs.get(), o.poll);
  const int connections = o.sim.connections > 0 ? o.sim.connections : o.sim.agents;
  std::cout << "ddp-loadgen: " << o.sim.agents << " agents over " << connections
            << " connection(s) to " << o.sim.coordinator << std::endl;
  if (o.job_nodes > 0 && o.submit_first) {
    if (absl::Status st = probe.Submit(o.job_nodes, o.job_slots > 0 ? o.job_slots : o.sim.slots); !st.ok()) {
      std::cerr << "ddp-loadgen: " << st.message() << "\n";
      return 1;
    }
  }
  sim.Start();
  const absl::Time reg_start = absl::Now();
  absl::Time last_join;
  if (absl::Status st = sim.RegisterAll(&last_join); !st.ok()) {
    std::cerr << "ddp-loadgen: " << st.message() << "\n";
    return 1;
  }
  std::cout << "registered " << o.sim.agents << " agents in " << Seconds(last_join - reg_start)
            << " s; heartbeat interval " << absl::FormatDuration(sim.interval()) << std::endl;
  if (o.job_nodes > 0 && !o.submit_first) {
    if (absl::Status st = probe.Submit(o.job_nodes, o.job_slots > 0 ? o.job_slots : o.sim.slots); !st.ok()) {
      std::cerr << "ddp-loadgen: " << st.message() << "\n";
      return 1;
    }
  }
  absl::SleepFor(o.warmup);
  const auto summary_before = Summary(jobs.get());
  std::optional<ProcSample> cpu_from;
  if (o.coordinator_pid > 0) {
    if (auto s = SampleProcess(static_cast<pid_t>(o.coordinator_pid)); s.ok()) cpu_from = *s;
  }
  const double self_from = SelfCpuSeconds();
  sim.BeginWindow();
  const absl::Time window_end = absl::Now() + o.duration;
  absl::SleepFor(o.duration);
  WindowStats w = sim.EndWindow();
  const double self_cores = (SelfCpuSeconds() - self_from) / w.seconds;
  std::optional<ProcSample> cpu_to;
  if (o.coordinator_pid > 0) {
    if (auto s = SampleProcess(static_cast<pid_t>(o.coordinator_pid)); s.ok()) cpu_to = *s;
  }
  const auto summary_after = Summary(jobs.get());
  if (o.job_nodes > 0) probe.WaitFinished(std::max(absl::ZeroDuration(),
                                                   o.job_timeout - (absl::Now() - window_end)));
  probe.Stop();
  const TaskTimes tasks = sim.task_times();
  sim.Stop();

  // --- Report ---
  const double interval_s = absl::ToDoubleSeconds(sim.interval());
  const double target = o.sim.agents / interval_s;
  const double achieved = static_cast<double>(w.ok) / w.seconds;
  JsonObject json;
  json.Add("agents", o.sim.agents).Add("connections", connections);
  json.Add("heartbeat_interval_s", interval_s).Add("window_s", w.seconds);
  json.Add("target_heartbeats_per_s", target).Add("achieved_heartbeats_per_s", achieved);
  json.Add("sent", w.sent).Add("ok", w.ok).Add("errors", w.errors).Add("skipped", w.skipped);
  json.Add("latency_ms_p50", w.Percentile(50)).Add("latency_ms_p90", w.Percentile(90));
  json.Add("latency_ms_p99", w.Percentile(99));
  json.Add("quiet_beats", o.sim.quiet_beats).Add("unanswered", w.unanswered).Add("news", w.news);
  json.Add("latency_ms_max", w.latency_ms.empty() ? 0.0 : w.latency_ms.back());
  json.Add("generator_cores", self_cores);
  std::cout << absl::StrFormat(
      "window %.1f s after %s warm-up\nheartbeats: %d ok, %d errors, %d skipped (previous in "
      "flight) -> achieved %.1f/s of %.1f/s target (%.1f%%)\nlatency ms: p50 %.2f  p90 %.2f  "
      "p99 %.2f  max %.2f\ngenerator: %.2f cores\n",
      w.seconds, absl::FormatDuration(o.warmup), w.ok, w.errors, w.skipped, achieved, target,
      100 * achieved / target, w.Percentile(50), w.Percentile(90), w.Percentile(99),
      w.latency_ms.empty() ? 0.0 : w.latency_ms.back(), self_cores);
  for (const auto& [code, n] : w.error_codes) std::cout << "  error " << code << ": " << n << "\n";
  if (o.sim.quiet_beats > 0) {
    std::cout << absl::StrFormat(
        "quiet beats (one in %d asks): %d of the ok beats unanswered (latency of the answered "
        "ones above), %d answers with news\n",
        o.sim.quiet_beats, w.unanswered, w.news);
  }
  if (w.reports_ok + w.reports_failed > 0) {
    std::cout << absl::StrFormat("step events: %d in %d ReportEvents calls (%d failed)\n",
                                 w.events, w.reports_ok, w.reports_failed);
    json.Add("step_events", w.events).Add("reports_failed", w.reports_failed);
  }
  if (cpu_from && cpu_to && baseline) {
    const double cores = CoresBetween(*cpu_from, *cpu_to);
    const double us_per_beat = w.ok > 0 ? 1e6 * (cpu_to->cpu_s - cpu_from->cpu_s) /
                                              static_cast<double>(w.ok + w.reports_ok)
                                        : 0;
    const double rss_per_agent_kb =
        static_cast<double>(cpu_to->rss_kb - baseline->rss_kb) / o.sim.agents;
    std::cout << absl::StrFormat(
        "coordinator (pid %d): %.3f cores (utime+stime over the window) = %.1f us of CPU per "
        "RPC; RSS %.1f MB (%.1f MB before the agents: %.1f KB per agent)\n",
        o.coordinator_pid, cores, us_per_beat, cpu_to->rss_kb / 1024.0, baseline->rss_kb / 1024.0,
        rss_per_agent_kb);
    json.Add("coordinator_cores", cores).Add("coordinator_us_per_rpc", us_per_beat);
    json.Add("coordinator_rss_mb", cpu_to->rss_kb / 1024.0);
    json.Add("coordinator_rss_baseline_mb", baseline->rss_kb / 1024.0);
    json.Add("coordinator_rss_kb_per_agent", rss_per_agent_kb);
  }
  if (summary_before && summary_after) {
    const int64_t lost = summary_after->lost_events() - summary_before->lost_events();
    std::cout << "workers declared lost during the window: " << lost << " (now "
              << summary_after->alive() << " alive of " << summary_after->workers() << ")\n";
    json.Add("lost_in_window", lost).Add("alive_after", summary_after->alive());
  }
  if (sim.reregistrations() > 0) {
    std::cout << "agents that had to register again: " << sim.reregistrations() << "\n";
  }
  json.Add("reregistrations", sim.reregistrations());
  if (o.job_nodes > 0) {
    const JobTimeline job = probe.timeline();
    std::cout << "job " << job.id << " (" << o.job_nodes << " nodes): ";
    JsonObject j;
    j.Add("id", job.id).Add("nodes", o.job_nodes).Add("world_size", job.world_size);
    j.Add("agents_with_task", tasks.agents_with_task);
    if (tasks.agents_with_task > 0) {
      const absl::Duration hold = tasks.last_task_received - last_join;
      std::cout << tasks.agents_with_task << " agents held a task, the last "
                << Seconds(hold) << " s after the last join (heartbeat interval "
                << Seconds(sim.interval()) << " s)";
      j.Add("last_join_to_all_hold_task_s", absl::ToDoubleSeconds(hold));
    }
    if (tasks.agents_reported_up > 0 && job.running) {
      const absl::Duration up = *job.running - tasks.last_up_sent;
      std::cout << "; RUNNING seen " << Seconds(up) << " s after the last pid report was sent"
                << " (" << Seconds(*job.running - tasks.last_up_answered)
                << " s after it was answered; polled every " << absl::FormatDuration(o.poll)
                << ")";
      j.Add("last_pid_report_to_running_s", absl::ToDoubleSeconds(up));
    }
    if (job.finished) {
      std::cout << "; " << job.outcome << " after " << Seconds(*job.finished - job.submitted)
                << " s";
      j.Add("outcome", job.outcome);
    } else {
      std::cout << "; not finished within --job-timeout";
      j.Add("outcome", "not finished");
    }
    std::cout << "\n";
    json.AddRaw("job", j.str());
  }
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    out << json.Line();
  }
  return 0;
}

}  // namespace
}  // namespace ddp::loadgen

int main(int argc, char** argv) {
  // Debian's Abseil checks every Mutex for deadlocks: not what we measure.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  ddp::loadgen::Options o;
  ddp::FlagSet flags("ddp-loadgen",
                     "Simulated node agents (WorkerService over gRPC's callback API) against a "
                     "real ddp-coordinator; reports achieved rates, latency and the "
                     "coordinator's CPU and memory.");
  flags.String("coordinator", &o.sim.coordinator, "the coordinator's HOST:PORT");
  flags.Int("agents", &o.sim.agents, "simulated agents");
  flags.Int("connections", &o.sim.connections,
            "TCP connections they share (0: one per agent)");
  flags.Double("rate", &o.sim.rate, "heartbeats per agent per second (0: the coordinator's)");
  flags.Int("slots", &o.sim.slots, "slots per agent");
  flags.Int("threads", &o.sim.threads, "driver threads issuing the calls");
  flags.String("prefix", &o.sim.prefix, "agent names are PREFIX-00000, PREFIX-00001, ...");
  flags.Bool("fake-trainers", &o.sim.fake_trainers,
             "run tasks handed out: report pids, then exit 0 after --train-time");
  flags.Duration("train-time", &o.sim.train_time, "how long a fake trainer runs");
  flags.Duration("step-every", &o.sim.step_every,
                 "a step event per rank this often while running (0: none)");
  flags.Int("never-start", &o.sim.never_start, "the first N agents never report trainers up");
  flags.Bool("heartbeat-stream", &o.sim.stream,
             "heartbeats over one WorkerService.HeartbeatStream per agent, as ddp-worker sends "
             "them (default: a unary Heartbeat call each, as agents before the stream did)");
  flags.Int("quiet-beats", &o.sim.quiet_beats,
            "with --heartbeat-stream: quiet heartbeats (decision 161), the coordinator asked to "
            "answer one beat in this many, as ddp-worker asks where the timeouts allow it "
            "(0: every beat answered)");
  flags.Int("witness-port", &o.sim.witness_port,
            "the health port each agent names, so the coordinator hands out witnesses as "
            "it does to ddp-workers, which serve one by default (0: none)");
  flags.Duration("warmup", &o.warmup, "after registering, before measuring");
  flags.Duration("duration", &o.duration, "the measurement window");
  flags.Int("coordinator-pid", &o.coordinator_pid,
            "measure this process's CPU (utime+stime) and RSS from /proc");
  flags.Int("job-nodes", &o.job_nodes, "submit a job needing this many nodes (0: none)");
  flags.Int("job-slots", &o.job_slots,
            "the job's ranks per node (0: the agents' --slots; more: a job no node can hold)");
  flags.Bool("submit-first", &o.submit_first, "submit the job before the agents register");
  flags.Duration("job-timeout", &o.job_timeout, "how long to wait for the job to end");
  flags.Duration("poll", &o.poll, "how often the job is polled until it runs");
  flags.String("json", &o.json, "also write the results as one JSON object to this file");
  auto positional = flags.Parse(argc, argv);
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    return 0;
  }
  if (!positional.ok() || !positional->empty() || o.sim.agents < 1 || o.sim.slots < 1) {
    std::cerr << "ddp-loadgen: "
              << (!positional.ok() ? std::string(positional.status().message())
                                   : "--agents and --slots must be >= 1, no positional arguments")
              << "\n"
              << flags.Usage();
    return 2;
  }
  return ddp::loadgen::Run(o);
}
