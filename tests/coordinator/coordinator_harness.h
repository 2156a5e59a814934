// The one harness of the facade's tests: a Coordinator driven with a FakeClock, for
// tests that speak to it as workers and clients do (no sockets). It runs on the
// in-memory store (memory_store.h), or on SQLite in a scratch directory when a test
// sets sqlite_ in its constructor (to meet the database itself: RunSql). Open() again
// is a coordinator restart on the same state; the directory is removed at the end. A
// test sets options_, limits_ and retention_ (in its constructor, or before an
// Open()) to run with other timings or bounds.
#ifndef DDP_TESTS_COORDINATOR_COORDINATOR_HARNESS_H_
#define DDP_TESTS_COORDINATOR_COORDINATOR_HARNESS_H_

#include <sqlite3.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "coordinator/core/coordinator.h"
#include "coordinator/core/event_hub.h"
#include "coordinator/store/state_store.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/coordinator/memory_store.h"

namespace ddp::testing {

class CoordinatorHarness : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("coordinator-harness");
    Open();
  }
  void TearDown() override {
    coordinator_.reset();
    hub_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  // (Re)starts the coordinator on the state directory and recovers what it holds.
  void Open() {
    coordinator_.reset();
    hub_.reset();
    store_.reset();
    if (sqlite_) {
      auto store = StateStore::Open(dir_, retention_);
      ASSERT_TRUE(store.ok()) << store.status();
      store_ = std::move(*store);
    } else {
      auto store = std::make_unique<MemoryStore>(retention_, memory_);
      memory_ = store->data();  // The next Open() finds the same rows.
      store_ = std::move(store);
    }
    hub_ = std::make_unique<EventHub>(store_.get(), &clock_, EventHub::Options{});
    coordinator_ =
        std::make_unique<Coordinator>(options_, store_.get(), hub_.get(), &clock_, limits_);
    ASSERT_TRUE(coordinator_->Recover().ok());
  }

  // A worker with `gpus` GPUs named GPU-<name>-<index> (as a fake NVML inventory
  // lists them) and `slots` slots (default: one per GPU, at least 1), registered as
  // `incarnation` (default <name>-inc; a new one is an agent restart). Its address is
  // 10.0.0.<the name's last digit> (w2: 10.0.0.2), else 10.0.0.1.
  void Register(const std::string& name, int gpus = 0, int slots = 0,
                const std::string& incarnation = "", const Labels& labels = {}) {
    v1::RegisterRequest req;
    for (const auto& [key, value] : labels) (*req.mutable_labels())[key] = value;
    req.set_worker(name);
    incarnations_[name] = incarnation.empty() ? name + "-inc" : incarnation;
    req.set_incarnation(incarnations_[name]);
    const bool digit = !name.empty() && std::isdigit(static_cast<unsigned char>(name.back()));
    req.set_address(std::string("10.0.0.") + (digit ? name.back() : '1'));
    req.set_slots(slots > 0 ? slots : std::max(1, gpus));
    req.set_gpus(gpus);
    for (int g = 0; g < gpus; ++g) {
      v1::GpuDevice* d = req.add_gpu_devices();
      d->set_index(g);
      d->set_uuid(absl::StrCat("GPU-", name, "-", g));
      d->set_model("NVIDIA H100 80GB HBM3");
      d->set_memory_bytes(int64_t{80} << 30);
    }
    auto st = coordinator_->Register(req);
    ASSERT_TRUE(st.ok()) << st.status();
  }

  // A heartbeat from `name` reporting `tasks`, with two free ports (two jobs may form
  // on one node at once).
  v1::HeartbeatResponse HeartbeatReply(const std::string& name,
                                       const std::vector<v1::TaskStatus>& tasks = {}) {
    v1::HeartbeatRequest req;
    req.set_worker(name);
    req.set_incarnation(Incarnation(name));
    for (const auto& t : tasks) *req.add_tasks() = t;
    req.add_free_ports(next_port_++);
    req.add_free_ports(next_port_++);
    auto resp = coordinator_->Heartbeat(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? *resp : v1::HeartbeatResponse();
  }
  // The tasks it should run.
  std::vector<v1::Task> Heartbeat(const std::string& name,
                                  const std::vector<v1::TaskStatus>& tasks = {}) {
    const v1::HeartbeatResponse resp = HeartbeatReply(name, tasks);
    return {resp.tasks().begin(), resp.tasks().end()};
  }

  const std::string& Incarnation(const std::string& worker) {
    auto [it, added] = incarnations_.try_emplace(worker, worker + "-inc");
    return it->second;
  }

  // What a worker reports for `task`: every rank running (or exited).
  static v1::TaskStatus Running(const v1::Task& task, bool exited = false) {
    v1::TaskStatus s;
    s.set_job_id(task.job_id());
    s.set_attempt(task.attempt());
    for (int rank : task.ranks()) {
      v1::LocalRankStatus* r = s.add_ranks();
      r->set_rank(rank);
      r->set_pid(1000 + rank);
      r->set_exited(exited);
    }
    return s;
  }

  // What a worker reports for `task`: every rank running, or, with `exit_code`,
  // exited with it.
  static v1::TaskStatus Report(const v1::Task& task, std::optional<int> exit_code = std::nullopt) {
    v1::TaskStatus s = Running(task, exit_code.has_value());
    for (v1::LocalRankStatus& r : *s.mutable_ranks()) r.set_exit_code(exit_code.value_or(0));
    return s;
  }

  // Events from `worker` (its current incarnation) for `job_id`'s `attempt`: one per
  // element of `events`, each from `rank`.
  absl::Status ReportEvents(const std::string& worker, const std::string& job_id, int attempt,
                            int rank, const std::vector<v1::TrainerEvent>& events) {
    v1::ReportEventsRequest req;
    req.set_worker(worker);
    req.set_incarnation(Incarnation(worker));
    for (const v1::TrainerEvent& event : events) {
      v1::ReportedEvent* e = req.add_events();
      e->set_job_id(job_id);
      e->set_attempt(attempt);
      e->set_rank(rank);
      *e->mutable_event() = event;
      e->mutable_event()->set_rank(rank);
    }
    return coordinator_->ReportEvents(req);
  }

  // Output lines from `worker` for rank 0 of `job_id`'s attempt 1.
  absl::Status ReportLines(const std::string& worker, const std::string& job_id,
                           const std::vector<std::string>& texts) {
    v1::ReportEventsRequest req;
    req.set_worker(worker);
    req.set_incarnation(Incarnation(worker));
    for (const std::string& text : texts) {
      v1::ReportedEvent* e = req.add_events();
      e->set_job_id(job_id);
      e->set_attempt(1);
      e->mutable_log()->set_stream("stdout");
      e->mutable_log()->set_text(text);
    }
    return coordinator_->ReportEvents(req);
  }

  // Runs `sql` on the state database through a connection of its own, as another
  // process (or an operator) would (sqlite_ only).
  void RunSql(const std::string& sql) {
    ASSERT_TRUE(sqlite_) << "RunSql needs the SQLite store: set sqlite_ in the constructor";
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir_ + "/ddp.sqlite").c_str(), &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 10000);  // The coordinator's store writer may be committing.
    char* err = nullptr;
    const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
    EXPECT_EQ(rc, SQLITE_OK) << (err ? err : "");
    sqlite3_free(err);
    sqlite3_close(db);
  }

  // The in-memory store (not with sqlite_).
  MemoryStore& memory() { return *static_cast<MemoryStore*>(store_.get()); }

  // A submission by `caller`, as the RPC layer makes it.
  absl::StatusOr<v1::Job> Submit(const std::string& yaml, const Caller& caller) {
    v1::SubmitJobRequest req;
    req.set_spec_yaml(yaml);
    return coordinator_->Submit(req, caller);
  }

  std::string Submit(const std::string& yaml) {
    v1::SubmitJobRequest req;
    req.set_spec_yaml(yaml);
    auto job = coordinator_->Submit(req);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : "";
  }

  v1::Job Get(const std::string& id) {
    auto job = coordinator_->GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  // The task of job `id` among `tasks`, or null.
  static const v1::Task* TaskOf(const std::string& id, const std::vector<v1::Task>& tasks) {
    for (const v1::Task& t : tasks) {
      if (t.job_id() == id) return &t;
    }
    return nullptr;
  }

  std::string dir_;
  FakeClock clock_;
  CoordinatorOptions options_;
  UsageLimits limits_;
  RetentionOptions retention_;
  bool sqlite_ = false;
  std::shared_ptr<MemoryStore::Data> memory_;  // The fake's rows, across Open()s.
  std::unique_ptr<Store> store_;
  std::unique_ptr<EventHub> hub_;
  std::unique_ptr<Coordinator> coordinator_;
  int next_port_ = 41000;
  std::map<std::string, std::string> incarnations_;  // By worker name.
};

// The timing coordinator_test.cc and heartbeat_rate_test.cc drive: a 1 s heartbeat
// interval and a 10 s timeout, RPCs held 500 ms, and workers that beat right after
// registering, as agents do.
class TimedCoordinatorHarness : public CoordinatorHarness {
 protected:
  TimedCoordinatorHarness() {
    options_.rpc_deadline = absl::Milliseconds(500);
    options_.heartbeat_interval = absl::Seconds(1);
    options_.heartbeat_timeout = absl::Seconds(10);
  }

  void Register(const std::string& name, int slots = 1, const std::string& incarnation = "") {
    CoordinatorHarness::Register(name, /*gpus=*/0, slots,
                                 incarnation.empty() ? name + "-inc1" : incarnation);
    Heartbeat(name);
  }
};

}  // namespace ddp::testing

#endif  // DDP_TESTS_COORDINATOR_COORDINATOR_HARNESS_H_
