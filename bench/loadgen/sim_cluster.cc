#include "bench/loadgen/sim_cluster.h"

#include <grpc/grpc.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <set>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace ddp::loadgen {
namespace {

constexpr int kStoppedExitCode = 143;  // SIGTERM, as a stopped trainer exits.

std::string CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    default: return absl::StrCat("code ", static_cast<int>(code));
  }
}

}  // namespace

// One agent's heartbeat stream: a beat is written, its answer read, then the next.
// Held open (AddHold) until Close(); a stream that breaks answers its beat with the
// status the coordinator ended it with, and the agent opens another at its next beat.
// Quiet (SimOptions::quiet_beats): a read is always outstanding; a beat that asks for
// its answer ends when both its write and its answer are done, the others when written;
// answers no beat waits for are news (their desired state applies).
class SimCluster::BeatStream final
    : public grpc::ClientBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse> {
 public:
  BeatStream(SimCluster* sim, Agent* agent, bool quiet)
      : sim_(sim), agent_(agent), quiet_(quiet) {
    agent->stub->async()->HeartbeatStream(&ctx_, this);  // Binds the call: holds after.
    AddHold();
    if (quiet_) StartRead(&resp_);
    StartCall();
  }
  void Send(Beat beat) {
    {
      absl::MutexLock lock(&mu_);
      beat_ = std::move(beat);
      pending_ = true;
      written_ = false;
      answer_.reset();
    }
    StartWrite(&beat_.req);
  }
  // Ends the stream (the agent stops, or it broke); OnDone follows.
  void Close(bool writes_done) {
    {
      absl::MutexLock lock(&mu_);
      if (!held_) return;
      held_ = false;
    }
    if (writes_done) StartWritesDone();
    RemoveHold();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Broke();
      return;
    }
    if (!quiet_) {
      StartRead(&resp_);
      return;
    }
    Beat beat;
    std::optional<v1::HeartbeatResponse> answer;
    {
      absl::MutexLock lock(&mu_);
      written_ = true;
      if (beat_.req.answer_now() && !answer_.has_value()) return;  // Its answer next.
      beat = std::move(beat_);
      answer = std::move(answer_);
      pending_ = false;
    }
    if (answer.has_value()) {
      sim_->Answered(*agent_, grpc::Status::OK, *answer, std::move(beat));
    } else {
      sim_->Answered(*agent_, grpc::Status::OK, v1::HeartbeatResponse(), std::move(beat),
                     Outcome::kUnanswered);
    }
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Broke();
      return;
    }
    if (!quiet_) {
      Beat beat;
      {
        absl::MutexLock lock(&mu_);
        beat = std::move(beat_);
        pending_ = false;
      }
      sim_->Answered(*agent_, grpc::Status::OK, resp_, std::move(beat));
      return;
    }
    v1::HeartbeatResponse resp = std::move(resp_);
    resp_.Clear();
    StartRead(&resp_);
    Beat beat;
    bool done = false;
    {
      absl::MutexLock lock(&mu_);
      const bool awaited = pending_ && beat_.req.answer_now() && !answer_.has_value() &&
                           resp.acked_seq() >= beat_.req.beat_seq();
      if (awaited && written_) {
        beat = std::move(beat_);
        pending_ = false;
        done = true;
      } else if (awaited) {
        answer_ = resp;  // Its write's completion ends the beat.
        return;
      }
    }
    if (done) {
      sim_->Answered(*agent_, grpc::Status::OK, resp, std::move(beat));
    } else {
      sim_->OnHeartbeat(*agent_, grpc::Status::OK, resp, absl::Now(), false, {}, Outcome::kNews);
    }
  }
  void OnDone(const grpc::Status& status) override {
    bool pending;
    Beat beat;
    {
      absl::MutexLock lock(&mu_);
      pending = broken_ && pending_;
      beat = std::move(beat_);
    }
    {
      absl::MutexLock lock(&agent_->mu);
      if (agent_->stream == this) agent_->stream = nullptr;
    }
    // The beat in flight when it broke is answered with the stream's status.
    if (pending) {
      sim_->Answered(*agent_, status.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "closed")
                                          : status,
                     v1::HeartbeatResponse(), std::move(beat));
    }
    {
      absl::MutexLock lock(&sim_->mu_);
      --sim_->open_streams_;
    }
    delete this;
  }

 private:
  void Broke() {
    {
      absl::MutexLock lock(&mu_);
      if (broken_) return;  // A quiet stream's read and write may both fail.
      broken_ = true;
    }
    {
      absl::MutexLock lock(&agent_->mu);
      if (agent_->stream == this) agent_->stream = nullptr;  // The next beat opens another.
    }
    Close(/*writes_done=*/false);
  }

  SimCluster* const sim_;
  Agent* const agent_;
  const bool quiet_;
  grpc::ClientContext ctx_;
  v1::HeartbeatResponse resp_;
  absl::Mutex mu_;
  Beat beat_ ABSL_GUARDED_BY(mu_);
  bool pending_ ABSL_GUARDED_BY(mu_) = false;  // beat_ is not yet answered.
  bool written_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<v1::HeartbeatResponse> answer_ ABSL_GUARDED_BY(mu_);  // Before its write ended.
  bool held_ ABSL_GUARDED_BY(mu_) = true;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
};

double WindowStats::Percentile(double p) const {
  if (latency_ms.empty()) return 0;
  const size_t i = std::min(latency_ms.size() - 1,
                            static_cast<size_t>(p / 100.0 * static_cast<double>(latency_ms.size())));
  return latency_ms[i];
}

SimCluster::SimCluster(SimOptions options) : options_(std::move(options)) {
  const int connections = options_.connections > 0 ? std::min(options_.connections, options_.agents)
                                                   : options_.agents;
  for (int c = 0; c < connections; ++c) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // A TCP connection of its own.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    channels_.push_back(grpc::CreateCustomChannel(options_.coordinator,
                                                  grpc::InsecureChannelCredentials(), args));
    stubs_.push_back(v1::WorkerService::NewStub(channels_.back()));
  }
  absl::BitGen rng;
  for (int i = 0; i < options_.agents; ++i) {
    auto agent = std::make_unique<Agent>();
    agent->index = i;
    agent->name = absl::StrFormat("%s-%05d", options_.prefix, i);
    agent->incarnation = absl::StrFormat("%016x", absl::Uniform<uint64_t>(rng));
    agent->stub = stubs_[static_cast<size_t>(i % connections)].get();
    agents_.push_back(std::move(agent));
  }
  if (options_.rate > 0) interval_ = absl::Seconds(1.0 / options_.rate);
  absl::MutexLock lock(&mu_);
  joined_.resize(static_cast<size_t>(std::max(1, options_.threads)));
}

SimCluster::~SimCluster() { Stop(); }

void SimCluster::CallStarted() {
  absl::MutexLock lock(&mu_);
  ++in_flight_;
}

void SimCluster::CallDone() {
  absl::MutexLock lock(&mu_);
  --in_flight_;
}

void SimCluster::Register(Agent& agent, std::function<void(grpc::Status)> done) {
  struct Call {
    grpc::ClientContext ctx;
    v1::RegisterRequest req;
    v1::RegisterResponse resp;
  };
  auto* call = new Call;
  call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  call->req.set_worker(agent.name);
  call->req.set_incarnation(agent.incarnation);
  call->req.set_address("127.0.0.1");
  call->req.set_hostname(agent.name);
  call->req.set_slots(options_.slots);
  call->req.set_version("ddp-loadgen");
  call->req.set_witness_port(options_.witness_port);
  CallStarted();
  agent.stub->async()->Register(
      &call->ctx, &call->req, &call->resp, [this, call, &agent, done](grpc::Status st) {
        if (st.ok()) {
          {
            absl::MutexLock lock(&agent.mu);
            agent.registered = true;
          }
          absl::MutexLock lock(&mu_);
          if (options_.rate <= 0 && call->resp.heartbeat_interval_ms() > 0) {
            interval_ = absl::Milliseconds(call->resp.heartbeat_interval_ms());
          }
          if (call->resp.rpc_deadline_ms() > 0) {
            rpc_deadline_ = absl::Milliseconds(call->resp.rpc_deadline_ms());
          }
          joined_[static_cast<size_t>(agent.index) % joined_.size()].push_back(agent.index);
        }
        done(st);
        delete call;
        CallDone();
      });
}

absl::Status SimCluster::RegisterAll(absl::Time* last_join) {
  absl::Mutex mu;
  int in_flight = 0, done = 0;
  absl::Status failure;
  absl::Time last = absl::InfinitePast();
  for (auto& agent : agents_) {
    {
      absl::MutexLock lock(&mu);
      auto room = [&]() { return in_flight < options_.register_in_flight; };
      mu.Await(absl::Condition(&room));
      if (!failure.ok()) break;
      ++in_flight;
    }
    // As ddp-worker does, an agent that cannot reach the coordinator tries again
    // (gRPC's channel backs off between connection attempts).
    auto attempt = std::make_shared<std::function<void(int)>>();
    Agent* a = agent.get();
    *attempt = [&, a, attempt](int tries) {
      Register(*a, [&, a, attempt, tries](grpc::Status st) {
        if (!st.ok() && st.error_code() == grpc::StatusCode::UNAVAILABLE && tries < 20) {
          reregistrations_.fetch_add(1);
          (*attempt)(tries + 1);
          return;
        }
        absl::MutexLock lock(&mu);
        --in_flight;
        ++done;
        last = std::max(last, absl::Now());
        if (!st.ok() && failure.ok()) {
          failure = absl::UnavailableError(absl::StrCat("register ", a->name, ": ",
                                                        CodeName(st.error_code()), ": ",
                                                        st.error_message()));
        }
        *attempt = nullptr;  // Breaks the cycle once done.
      });
    };
    (*attempt)(0);
  }
  absl::MutexLock lock(&mu);
  auto idle = [&]() { return in_flight == 0; };
  mu.Await(absl::Condition(&idle));
  *last_join = last;
  return failure;
}

void SimCluster::Start() {
  size_t shards;
  {
    absl::MutexLock lock(&mu_);
    shards = joined_.size();
  }
  for (size_t i = 0; i < shards; ++i) {
    drivers_.emplace_back([this, i] { Loop(static_cast<int>(i)); });
  }
}

void SimCluster::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : drivers_) t.join();
  drivers_.clear();
  {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; };
    mu_.Await(absl::Condition(&idle));
  }
  for (auto& agent : agents_) {
    BeatStream* stream;
    {
      absl::MutexLock lock(&agent->mu);
      stream = agent->stream;
      agent->stream = nullptr;
    }
    if (stream != nullptr) stream->Close(/*writes_done=*/true);
  }
  absl::MutexLock lock(&mu_);
  auto closed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return open_streams_ == 0; };
  mu_.Await(absl::Condition(&closed));
}

void SimCluster::Loop(int shard) {
  std::priority_queue<Due, std::vector<Due>, std::greater<Due>> beats, reports;
  std::vector<int> mine;  // This driver's agents.
  for (size_t i = static_cast<size_t>(shard); i < agents_.size(); i += static_cast<size_t>(std::max(1, options_.threads))) {
    mine.push_back(static_cast<int>(i));
  }
  while (true) {
    const absl::Time now = absl::Now();
    absl::Duration interval;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      interval = interval_;
      // A newly registered agent heartbeats at once, as ddp-worker does.
      for (int i : joined_[static_cast<size_t>(shard)]) beats.emplace(now, i);
      joined_[static_cast<size_t>(shard)].clear();
    }
    while (!beats.empty() && beats.top().first <= now) {
      auto [due, i] = beats.top();
      beats.pop();
      Agent& agent = *agents_[static_cast<size_t>(i)];
      bool busy;
      {
        absl::MutexLock lock(&agent.mu);
        busy = agent.heartbeat_in_flight;
      }
      if (busy) {
        absl::MutexLock lock(&mu_);
        if (in_window_) ++window_.skipped;
      } else {
        SendHeartbeat(agent, now);
      }
      absl::Time next = due + interval;
      if (next < now - interval) next = now;  // Far behind: skip, do not burst.
      beats.emplace(next, i);
    }
    // Step events go out on their own schedule, spread over the period.
    if (options_.fake_trainers && options_.step_every > absl::ZeroDuration()) {
      if (reports.empty()) {
        for (size_t k = 0; k < mine.size(); ++k) {
          reports.emplace(now + options_.step_every * (static_cast<double>(k) /
                                                       static_cast<double>(mine.size())),
                          mine[k]);
        }
      }
      while (!reports.empty() && reports.top().first <= now) {
        auto [due, i] = reports.top();
        reports.pop();
        SendReport(*agents_[static_cast<size_t>(i)]);
        reports.emplace(std::max(due + options_.step_every, now), i);
      }
    }
    absl::Time wake = now + absl::Milliseconds(2);
    if (!beats.empty()) wake = std::min(wake, beats.top().first);
    if (!reports.empty()) wake = std::min(wake, reports.top().first);
    absl::SleepFor(std::max(absl::ZeroDuration(), wake - absl::Now()));
  }
}

void SimCluster::SendHeartbeat(Agent& agent, absl::Time now) {
  struct Call {
    grpc::ClientContext ctx;
    v1::HeartbeatRequest req;
    v1::HeartbeatResponse resp;
  };
  auto* call = new Call;
  bool reports_up = false;
  std::vector<TaskKey> exits;
  {
    absl::MutexLock lock(&agent.mu);
    if (!agent.registered) {
      delete call;
      return;
    }
    agent.heartbeat_in_flight = true;
    call->req.set_worker(agent.name);
    call->req.set_incarnation(agent.incarnation);
    for (auto& [key, task] : agent.tasks) {
      if (task.state == FakeTask::State::kStarting && agent.index >= options_.never_start) {
        task.state = FakeTask::State::kRunning;  // Spawned since the last heartbeat.
        task.started = now;
        reports_up = true;
      } else if (task.state == FakeTask::State::kRunning && now - task.started >= options_.train_time) {
        task.state = FakeTask::State::kExited;
        task.exit_code = 0;
      }
      v1::TaskStatus* status = call->req.add_tasks();
      status->set_job_id(key.first);
      status->set_attempt(key.second);
      for (size_t l = 0; l < task.ranks.size(); ++l) {
        v1::LocalRankStatus* r = status->add_ranks();
        r->set_rank(task.ranks[l]);
        if (task.state == FakeTask::State::kStarting) continue;
        r->set_pid(100000 + agent.index * 64 + static_cast<int>(l));
        if (task.state == FakeTask::State::kExited) {
          r->set_exited(true);
          r->set_exit_code(task.exit_code);
        }
      }
      if (task.state == FakeTask::State::kExited) exits.push_back(key);
    }
    // Ports the rank-0 node offers for the rendezvous store, as the agent probes them.
    for (int p = 0; p < 4; ++p) call->req.add_free_ports(30000 + (agent.index * 4 + p) % 30000);
  }
  absl::Duration deadline;
  {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
    if (in_window_) ++window_.sent;
    deadline = rpc_deadline_;
    call->req.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(interval_));
  }
  // Timed from now, not from when the beat was due: a driver running late must not
  // shorten the coordinator's time to answer.
  now = absl::Now();
  if (options_.stream) {
    BeatStream* stream;
    {
      absl::MutexLock lock(&agent.mu);
      bool fresh = false;
      if (agent.stream == nullptr) {
        {
          absl::MutexLock sim_lock(&mu_);
          ++open_streams_;
        }
        agent.stream = new BeatStream(this, &agent, options_.quiet_beats > 0);
        fresh = true;
      }
      stream = agent.stream;
      if (options_.quiet_beats > 0) {
        // As ddp-worker asks (agent.cc): one beat in k, a new stream's first, and any
        // that reports something new.
        call->req.set_beat_seq(++agent.beat_seq);
        call->req.set_quiet(true);
        call->req.set_answer_now(fresh || reports_up || !exits.empty() ||
                                 agent.beat_seq % static_cast<uint64_t>(options_.quiet_beats) == 0);
      }
    }
    stream->Send(Beat{std::move(call->req), now, reports_up, std::move(exits)});
    delete call;
    return;
  }
  call->ctx.set_deadline(absl::ToChronoTime(now + deadline));
  agent.stub->async()->Heartbeat(
      &call->ctx, &call->req, &call->resp,
      [this, call, &agent, now, reports_up, exits = std::move(exits)](grpc::Status st) mutable {
        OnHeartbeat(agent, st, call->resp, now, reports_up, std::move(exits));
        delete call;
        CallDone();
      });
}

void SimCluster::Answered(Agent& agent, const grpc::Status& status,
                          const v1::HeartbeatResponse& resp, Beat beat, Outcome outcome) {
  OnHeartbeat(agent, status, resp, beat.sent, beat.reports_up, std::move(beat.exits), outcome);
  CallDone();
}

void SimCluster::OnHeartbeat(Agent& agent, const grpc::Status& st,
                             const v1::HeartbeatResponse& resp, absl::Time sent, bool reported_up,
                             std::vector<TaskKey> exits_sent, Outcome outcome) {
  const absl::Time now = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    // Heartbeat rate scaling (decision 162): the agents follow the interval the answers
    // give, as ddp-worker does (one interval for all: the coordinator gives every agent
    // the same).
    if (st.ok() && options_.rate <= 0 && resp.heartbeat_interval_ms() > 0 &&
        absl::Milliseconds(resp.heartbeat_interval_ms()) != interval_) {
      interval_ = absl::Milliseconds(resp.heartbeat_interval_ms());
    }
    if (in_window_) {
      if (outcome == Outcome::kNews) {
        ++window_.news;
      } else if (st.ok() && outcome == Outcome::kUnanswered) {
        ++window_.ok;
        ++window_.unanswered;
      } else if (st.ok()) {
        ++window_.ok;
        window_.latency_ms.push_back(absl::ToDoubleMilliseconds(now - sent));
      } else {
        ++window_.errors;
        ++window_.error_codes[CodeName(st.error_code())];
      }
    }
  }
  bool reregister = false;
  {
    absl::MutexLock lock(&agent.mu);
    if (outcome != Outcome::kNews) agent.heartbeat_in_flight = false;
    if (outcome == Outcome::kUnanswered) {
      // Written, not answered: nothing said back (its exits were none: such beats ask).
    } else if (!st.ok()) {
      if (st.error_code() == grpc::StatusCode::NOT_FOUND) {
        agent.registered = false;  // The coordinator forgot us (restarted on a new dir).
        reregister = true;
      }
    } else {
      if (reported_up && agent.up_sent == absl::InfinitePast()) {
        agent.up_sent = sent;
        agent.up_answered = now;
      }
      for (const TaskKey& key : exits_sent) {
        auto it = agent.tasks.find(key);
        if (it != agent.tasks.end()) it->second.exit_reported = true;
      }
      std::set<TaskKey> wanted;
      for (const v1::Task& t : resp.tasks()) {
        TaskKey key{t.job_id(), t.attempt()};
        wanted.insert(key);
        if (agent.tasks.count(key) || !options_.fake_trainers) continue;
        FakeTask& task = agent.tasks[key];
        task.ranks.assign(t.ranks().begin(), t.ranks().end());
        if (agent.first_task == absl::InfinitePast()) agent.first_task = now;
      }
      for (auto it = agent.tasks.begin(); it != agent.tasks.end();) {
        FakeTask& task = it->second;
        if (wanted.count(it->first)) {
          ++it;
          continue;
        }
        if (task.state != FakeTask::State::kExited) {  // Told to stop.
          task.state = FakeTask::State::kExited;
          task.exit_code = kStoppedExitCode;
          task.exit_reported = false;
        }
        it = task.exit_reported ? agent.tasks.erase(it) : std::next(it);
      }
    }
  }
  if (reregister) {
    reregistrations_.fetch_add(1);
    Register(agent, [](grpc::Status) {});
  }
}

void SimCluster::SendReport(Agent& agent) {
  struct Call {
    grpc::ClientContext ctx;
    v1::ReportEventsRequest req;
    v1::ReportEventsResponse resp;
  };
  auto* call = new Call;
  int events = 0;
  {
    absl::MutexLock lock(&agent.mu);
    if (!agent.registered || agent.report_in_flight) {
      delete call;
      return;
    }
    const int64_t now_ms = absl::ToUnixMillis(absl::Now());
    for (auto& [key, task] : agent.tasks) {
      if (task.state != FakeTask::State::kRunning) continue;
      ++task.global_step;
      for (int32_t rank : task.ranks) {
        v1::ReportedEvent* e = call->req.add_events();
        e->set_job_id(key.first);
        e->set_attempt(key.second);
        e->set_rank(rank);
        e->set_time_ms(now_ms);
        e->mutable_event()->set_rank(rank);
        v1::TrainerEvent::Step* step = e->mutable_event()->mutable_step();
        step->set_epoch(0);
        step->set_step(task.global_step - 1);
        step->set_steps(1000);
        step->set_global_step(task.global_step);
        step->set_loss(1.0 / static_cast<double>(task.global_step));
        step->set_samples_per_s(1000);
        step->set_step_ms(10);
        step->set_comm_ms(2);
        ++events;
      }
    }
    if (events == 0) {
      delete call;
      return;
    }
    agent.report_in_flight = true;
    call->req.set_worker(agent.name);
    call->req.set_incarnation(agent.incarnation);
    call->req.set_batch_seq(++agent.batch_seq);
  }
  call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + rpc_deadline_));
  CallStarted();
  agent.stub->async()->ReportEvents(
      &call->ctx, &call->req, &call->resp, [this, call, &agent, events](grpc::Status st) {
        {
          absl::MutexLock lock(&agent.mu);
          agent.report_in_flight = false;
        }
        {
          absl::MutexLock lock(&mu_);
          if (in_window_) {
            ++(st.ok() ? window_.reports_ok : window_.reports_failed);
            if (st.ok()) window_.events += events;
          }
        }
        delete call;
        CallDone();
      });
}

void SimCluster::BeginWindow() {
  absl::MutexLock lock(&mu_);
  window_ = WindowStats();
  window_.latency_ms.reserve(static_cast<size_t>(agents_.size()) * 128);
  window_start_ = absl::Now();
  in_window_ = true;
}

WindowStats SimCluster::EndWindow() {
  absl::MutexLock lock(&mu_);
  in_window_ = false;
  WindowStats out = std::move(window_);
  window_ = WindowStats();
  out.seconds = absl::ToDoubleSeconds(absl::Now() - window_start_);
  std::sort(out.latency_ms.begin(), out.latency_ms.end());
  return out;
}

TaskTimes SimCluster::task_times() {
  TaskTimes t;
  for (auto& agent : agents_) {
    absl::MutexLock lock(&agent->mu);
    if (agent->first_task != absl::InfinitePast()) {
      ++t.agents_with_task;
      t.last_task_received = std::max(t.last_task_received, agent->first_task);
    }
    if (agent->up_sent != absl::InfinitePast()) {
      ++t.agents_reported_up;
      t.last_up_sent = std::max(t.last_up_sent, agent->up_sent);
      t.last_up_answered = std::max(t.last_up_answered, agent->up_answered);
    }
  }
  return t;
}

}  // namespace ddp::loadgen
