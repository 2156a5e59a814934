// The state store on a real SQLite database in a scratch directory: every stored
// field round-trips, older databases gain new columns, retention, and the exclusive
// hold a store takes on its directory.
#include "coordinator/store/state_store.h"

#include <sqlite3.h>
#include <unistd.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/store/store_tables.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/common/test_util.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

v1::Job EndedJob(const std::string& id, int64_t end_ms) {
  v1::Job job;
  job.set_id(id);
  job.set_name(id);
  job.set_rdzv_id(id);
  job.set_state(v1::SUCCEEDED);
  job.set_end_ms(end_ms);
  v1::Attempt* a = job.add_attempts();
  a->set_number(1);
  a->set_state(v1::SUCCEEDED);
  v1::RankAssignment* r = a->add_ranks();
  r->set_rank(0);
  r->set_worker("w1");
  return job;
}

// `steps` metric rows and `lines` log lines (seq 1..lines) for `job_id`.
void AppendOutput(StateStore& store, const std::string& job_id, int steps, int lines) {
  std::vector<v1::RankMetrics> metrics;
  for (int i = 1; i <= steps; ++i) {
    v1::RankMetrics& m = metrics.emplace_back();
    m.set_attempt(1);
    m.set_global_step(i);
  }
  std::vector<v1::LogLine> logs;
  for (int i = 1; i <= lines; ++i) {
    v1::LogLine& l = logs.emplace_back();
    l.set_seq(i);
    l.set_attempt(1);
    l.set_text(absl::StrCat("line ", i));
  }
  ASSERT_TRUE(store.Append(job_id, metrics, {}, logs).ok());
}

std::vector<std::string> StoredJobIds(StateStore& store) {
  auto loaded = store.Load();
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  std::vector<std::string> ids;
  if (loaded.ok()) {
    for (const StoredJob& j : loaded->jobs) ids.push_back(j.job.id());
  }
  return ids;
}

TEST(JobsPastRetentionTest, KeepsTheJobsThatEndedLastWhateverTheirSubmissionOrder) {
  // "long" was submitted first but finished last: it is the newest finished job.
  std::vector<FinishedJob> finished = {
      {"long", /*end_ms=*/300, /*seq=*/1},
      {"short", /*end_ms=*/100, /*seq=*/2},
      {"medium", /*end_ms=*/200, /*seq=*/3},
  };
  EXPECT_THAT(JobsPastRetention(finished, 2), ElementsAre("short"));
  EXPECT_THAT(JobsPastRetention(finished, 1), ElementsAre("short", "medium"));
  EXPECT_THAT(JobsPastRetention(finished, 3), IsEmpty());
}

TEST(JobsPastRetentionTest, BreaksEndTimeTiesBySubmissionOrder) {
  std::vector<FinishedJob> finished = {{"b", 100, 2}, {"a", 100, 1}, {"c", 100, 3}};
  EXPECT_THAT(JobsPastRetention(finished, 1), ElementsAre("a", "b"));
}

TEST(StateStoreTest, RetentionDeletesJobsWholeAndTrimsEveryJobsOutputToTheNewest) {
  const std::string dir = testing::MakeTempDir("store-retention");
  RetentionOptions retention;
  retention.max_metric_rows = 3;
  retention.max_log_lines = 2;
  retention.retain_jobs = 1;
  auto store = StateStore::Open(dir, retention);
  ASSERT_TRUE(store.ok()) << store.status();
  StateStore& s = **store;
  ASSERT_TRUE(s.SaveJob(EndedJob("old", 100), 1).ok());
  ASSERT_TRUE(s.SaveJob(EndedJob("new", 200), 2).ok());
  AppendOutput(s, "old", 5, 4);
  AppendOutput(s, "new", 5, 4);

  ASSERT_TRUE(s.EnforceRetention({"old"}).ok());

  EXPECT_THAT(StoredJobIds(s), ElementsAre("new"));
  auto old_logs = s.ReadLogs("old", 0, std::nullopt, 100);
  ASSERT_TRUE(old_logs.ok());
  EXPECT_THAT(*old_logs, IsEmpty());
  auto old_metrics = s.MetricHistory("old");
  ASSERT_TRUE(old_metrics.ok());
  EXPECT_THAT(*old_metrics, IsEmpty());

  auto logs = s.ReadLogs("new", 0, std::nullopt, 100);
  ASSERT_TRUE(logs.ok());
  std::vector<int64_t> seqs;
  for (const auto& l : *logs) seqs.push_back(l.seq());
  EXPECT_THAT(seqs, ElementsAre(3, 4)) << "the newest max_log_lines lines";
  auto metrics = s.MetricHistory("new");
  ASSERT_TRUE(metrics.ok());
  std::vector<int64_t> steps;
  for (const auto& m : *metrics) steps.push_back(m.global_step());
  EXPECT_THAT(steps, ElementsAre(3, 4, 5)) << "the newest max_metric_rows rows";
}

TEST(StateStoreTest, RetentionCountsAJobsRowsFromTheDatabaseAfterARestart) {
  const std::string dir = testing::MakeTempDir("store-recount");
  RetentionOptions retention;
  retention.max_metric_rows = 4;
  retention.max_log_lines = 3;
  {
    auto store = StateStore::Open(dir, retention);
    ASSERT_TRUE(store.ok()) << store.status();
    AppendOutput(**store, "j", 3, 2);  // Within the bounds.
  }
  auto store = StateStore::Open(dir, retention);  // Knows nothing of "j" yet.
  ASSERT_TRUE(store.ok()) << store.status();
  StateStore& s = **store;
  std::vector<v1::RankMetrics> metrics(3);
  for (int i = 0; i < 3; ++i) {
    metrics[static_cast<size_t>(i)].set_attempt(1);
    metrics[static_cast<size_t>(i)].set_global_step(4 + i);
  }
  std::vector<v1::LogLine> logs(2);
  for (int i = 0; i < 2; ++i) logs[static_cast<size_t>(i)].set_seq(3 + i);
  ASSERT_TRUE(s.Append("j", metrics, {}, logs).ok());
  ASSERT_TRUE(s.EnforceRetention({}).ok());
  auto history = s.MetricHistory("j");
  ASSERT_TRUE(history.ok());
  std::vector<int64_t> steps;
  for (const auto& m : *history) steps.push_back(m.global_step());
  EXPECT_THAT(steps, ElementsAre(3, 4, 5, 6)) << "6 rows, 3 before the restart: 2 deleted";
  auto lines = s.ReadLogs("j", 0, std::nullopt, 100);
  ASSERT_TRUE(lines.ok());
  std::vector<int64_t> seqs;
  for (const auto& l : *lines) seqs.push_back(l.seq());
  EXPECT_THAT(seqs, ElementsAre(2, 3, 4));
  ASSERT_TRUE(s.EnforceRetention({}).ok()) << "nothing over a bound: nothing to do";
  EXPECT_EQ(s.MetricHistory("j")->size(), 4u);
}

TEST(StateStoreTest, WriteUpsertsExactlyTheRowsItIsGiven) {
  const std::string dir = testing::MakeTempDir("store-rows");
  auto store = StateStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  StateStore& s = **store;
  v1::Job job = EndedJob("j", 100);
  job.mutable_attempts(0)->add_ranks()->set_rank(1);
  job.mutable_attempts(0)->mutable_ranks(1)->set_worker("w2");
  ASSERT_TRUE(s.SaveJob(job, 1).ok());
  RowBatch batch;  // One rank changes: its row alone.
  v1::RankAssignment rank = job.attempts(0).ranks(1);
  rank.set_pid(77);
  batch.ranks.push_back({"j", 1, rank});
  ASSERT_TRUE(s.Write(batch).ok());
  auto loaded = s.Load();
  ASSERT_TRUE(loaded.ok());
  ASSERT_EQ(loaded->jobs.size(), 1u);
  const v1::Attempt& a = loaded->jobs[0].job.attempts(0);
  ASSERT_EQ(a.ranks_size(), 2);
  EXPECT_EQ(a.ranks(0).worker(), "w1");
  EXPECT_EQ(a.ranks(1).pid(), 77);
}

// Sets every singular scalar field of `m` (and of its singular message fields) not
// named in `skip` to a distinct non-default value: integers 1, 2, ...; strings "s<n>";
// booleans true; enums their last value.
void FillScalars(google::protobuf::Message* m, const std::set<std::string>& skip, int* n) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Descriptor* d = m->GetDescriptor();
  const google::protobuf::Reflection* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated() || skip.count(f->full_name())) continue;
    ++*n;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: r->SetInt32(m, f, *n); break;
      case FieldDescriptor::CPPTYPE_INT64: r->SetInt64(m, f, *n); break;
      case FieldDescriptor::CPPTYPE_UINT32: r->SetUInt32(m, f, *n); break;
      case FieldDescriptor::CPPTYPE_UINT64: r->SetUInt64(m, f, *n); break;
      case FieldDescriptor::CPPTYPE_DOUBLE: r->SetDouble(m, f, *n + 0.5); break;
      case FieldDescriptor::CPPTYPE_FLOAT: r->SetFloat(m, f, *n + 0.5f); break;
      case FieldDescriptor::CPPTYPE_BOOL: r->SetBool(m, f, true); break;
      case FieldDescriptor::CPPTYPE_STRING: r->SetString(m, f, absl::StrCat("s", *n)); break;
      case FieldDescriptor::CPPTYPE_ENUM:
        r->SetEnum(m, f, f->enum_type()->value(f->enum_type()->value_count() - 1));
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        FillScalars(r->MutableMessage(m, f), skip, n);
        break;
    }
  }
}

// A new field of a stored message is either stored (a line in store_tables.cc) or
// named here as not stored, with why: this test fails until one of the two is done.
const std::set<std::string>& NotStored() {
  static const auto* fields = new std::set<std::string>{
      // The live coordinator's view, recomputed when a job is read or scheduled.
      "ddp.v1.Job.queue_position", "ddp.v1.Job.unschedulable", "ddp.v1.Attempt.live_trainers",
      "ddp.v1.RankAssignment.lost", "ddp.v1.Job.preemption_loss_ms",
      // The worker's last NVML sample of the rank's GPU, shown while the job is read.
      "ddp.v1.RankAssignment.gpu_utilization_pct", "ddp.v1.RankAssignment.gpu_memory_used_mib",
      // The rank's flight recorder as its worker last read it, while the attempt runs
      // (decision 193: a stall's reason and the job's log keep what matters of it).
      "ddp.v1.RankAssignment.flight",
      // Its latest stacks' summary, likewise (decision 194: the stacks are in the log).
      "ddp.v1.RankAssignment.stack",
      // The spec's (spec_yaml is stored), shown again when the job is loaded; so is
      // Job.node_selector.
      "ddp.v1.Job.priority", "ddp.v1.Job.preemption",
      // The live registry's, learned again from the worker's next registration and
      // heartbeats.
      "ddp.v1.Worker.free_slots", "ddp.v1.Worker.alive", "ddp.v1.Worker.version",
      "ddp.v1.Worker.quarantined_until_ms", "ddp.v1.Worker.quarantine_reason",
  };
  return *fields;
}

TEST(StateStoreTest, EveryStoredFieldOfJobsAttemptsRanksAndWorkersRoundTrips) {
  const std::string dir = testing::MakeTempDir("store-round-trip");
  auto store = StateStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  int n = 0;
  v1::Job job;
  FillScalars(&job, NotStored(), &n);
  v1::Attempt* attempt = job.add_attempts();
  FillScalars(attempt, NotStored(), &n);
  attempt->set_number(1);
  attempt->set_state(v1::FAILED);
  FillScalars(attempt->add_ranks(), NotStored(), &n);
  for (int g : {1, 2}) {  // Live recoveries, one done and one under way, with awkward text.
    v1::Recovery* r = attempt->add_recoveries();
    FillScalars(r, NotStored(), &n);
    r->set_generation(g);
    r->add_ranks(g);
    r->add_ranks(g + 3);
    r->set_cause(absl::StrCat("rank ", g, " was killed by SIGKILL; \u00e9t\u00e9"));
    r->set_outcome(g == 1 ? "recovered" : "recovering");
    if (g == 2) r->set_end_ms(0);
  }
  v1::Worker worker;
  FillScalars(&worker, NotStored(), &n);
  worker.set_maintenance(v1::WORKER_DRAINING);
  worker.set_drain_policy(v1::DRAIN_NOW);
  (*worker.mutable_labels())["pool"] = "team-a";
  (*worker.mutable_labels())["example.com/rack"] = "";
  v1::GpuDevice* gpu = worker.add_gpu_devices();
  gpu->set_index(3);
  gpu->set_uuid("GPU-1234");
  gpu->set_model("NVIDIA H100 80GB HBM3");
  gpu->set_memory_bytes(int64_t{80} << 30);
  ASSERT_TRUE((*store)->SaveJob(job, 42).ok());
  ASSERT_TRUE((*store)->SaveWorker(worker).ok());
  store->reset();  // A restarted coordinator reads them back.

  store = StateStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  auto loaded = (*store)->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->jobs.size(), 1u);
  EXPECT_EQ(loaded->jobs[0].seq, 42);
  // Fields of the job that are other tables' rows, or are never stored.
  v1::Job want = job;
  want.clear_metrics();
  want.clear_epoch_history();
  want.clear_history();
  google::protobuf::util::MessageDifferencer diff;
  std::string report;
  diff.ReportDifferencesToString(&report);
  EXPECT_TRUE(diff.Compare(want, loaded->jobs[0].job)) << report;
  ASSERT_EQ(loaded->workers.size(), 1u);
  v1::Worker want_worker = worker;
  want_worker.clear_jobs();  // Derived from the rank tables.
  for (v1::GpuDevice& g : *want_worker.mutable_gpu_devices()) {
    g.clear_job_id();  // Who holds a GPU is the rank tables' business.
    g.clear_rank();
  }
  report.clear();
  EXPECT_TRUE(diff.Compare(want_worker, loaded->workers[0])) << report;
}

TEST(StateStoreTest, TheSchemaIsDerivedFromTheTableDescriptions) {
  const std::string sql = store::Attempts().CreateSql();
  EXPECT_THAT(sql, HasSubstr("CREATE TABLE IF NOT EXISTS attempts(job_id TEXT NOT NULL, "
                             "number INTEGER NOT NULL"));
  EXPECT_THAT(sql, HasSubstr("preempted INTEGER NOT NULL DEFAULT 0, generation INTEGER NOT NULL "
                             "DEFAULT 0, recoveries TEXT NOT NULL DEFAULT '', "
                             "PRIMARY KEY(job_id, number))"));
  EXPECT_EQ(store::Logs().InsertSql(),
            "INSERT OR REPLACE INTO logs(job_id, seq, attempt, rank, stream, text, time_ms) "
            "VALUES(?,?,?,?,?,?,?)");
  EXPECT_EQ(store::Epochs().SelectSql("WHERE job_id = ?"),
            "SELECT attempt, epoch, train_loss, val_loss, val_accuracy, time_ms FROM epochs "
            "WHERE job_id = ?");
  for (const store::TableInfo* t : store::AllTables()) {
    std::set<std::string> names;
    for (const store::ColumnInfo& c : t->columns) {
      EXPECT_TRUE(names.insert(c.name).second) << t->name << "." << c.name << " twice";
    }
  }
}

TEST(StateStoreTest, AnOlderDatabaseGainsThePreemptedColumnDerivedFromItsReasons) {
  const std::string dir = testing::MakeTempDir("store-preempted");
  {
    auto store = StateStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    v1::Job job = EndedJob("moved", 100);
    v1::Attempt* a = job.mutable_attempts(0);
    a->set_state(v1::FAILED);
    a->set_reason("preempted: worker w2 is draining");
    v1::Attempt* b = job.add_attempts();
    b->set_number(2);
    b->set_state(v1::FAILED);
    b->set_reason("rank 0 exited with code 1");
    ASSERT_TRUE((*store)->SaveJob(job, 1).ok());
  }
  // As a coordinator from before Attempt.preempted left it: the reason said it.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir + "/ddp.sqlite").c_str(), &db), SQLITE_OK);
  EXPECT_EQ(sqlite3_exec(db, "ALTER TABLE attempts DROP COLUMN preempted", nullptr, nullptr,
                         nullptr),
            SQLITE_OK);
  sqlite3_close(db);

  auto store = StateStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  auto loaded = (*store)->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->jobs.size(), 1u);
  ASSERT_EQ(loaded->jobs[0].job.attempts_size(), 2);
  EXPECT_TRUE(loaded->jobs[0].job.attempts(0).preempted());
  EXPECT_FALSE(loaded->jobs[0].job.attempts(1).preempted());
}

// Runs `sql` on the database of `dir` directly.
void ExecOn(const std::string& dir, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir + "/ddp.sqlite").c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(db);
}

TEST(StateStoreTest, ASchemaVersion1DatabaseIsMigratedAndGainsAClusterIdItKeeps) {
  const std::string dir = testing::MakeTempDir("store-v1");
  {
    auto store = StateStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->SaveJob(EndedJob("kept", 100), 1).ok());
  }
  // As the release of schema version 1 left it.
  ExecOn(dir, "DELETE FROM meta WHERE key = 'cluster_id'; UPDATE meta SET value = '1' WHERE key = "
              "'schema_version'");
  std::string cluster_id;
  {
    auto store = StateStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    auto loaded = (*store)->Load();
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ASSERT_EQ(loaded->jobs.size(), 1u);
    EXPECT_EQ(loaded->jobs[0].job.id(), "kept");
    EXPECT_EQ(loaded->cluster_id.size(), 32u);
    cluster_id = loaded->cluster_id;
  }
  auto store = StateStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Load()->cluster_id, cluster_id) << "made once";
}

TEST(StateStoreTest, ADatabaseOfANewerSchemaIsRefusedUntouched) {
  const std::string dir = testing::MakeTempDir("store-newer");
  {
    auto store = StateStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->SaveJob(EndedJob("kept", 100), 1).ok());
  }
  ExecOn(dir, "UPDATE meta SET value = '99' WHERE key = 'schema_version'; "
              "ALTER TABLE jobs DROP COLUMN owner");  // As if a newer release had.
  EXPECT_THAT(StateStore::Open(dir),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::AllOf(HasSubstr("schema version 99"), HasSubstr("newer"),
                                        HasSubstr("Nothing was changed"))));
  // Untouched: no column added back, the version as it was.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir + "/ddp.sqlite").c_str(), &db), SQLITE_OK);
  sqlite3_stmt* s = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT value FROM meta WHERE key = 'schema_version'", -1, &s,
                               nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(s), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(s, 0)), "99");
  sqlite3_finalize(s);
  EXPECT_NE(sqlite3_prepare_v2(db, "SELECT owner FROM jobs", -1, &s, nullptr), SQLITE_OK)
      << "the dropped column was not added back";
  sqlite3_finalize(s);
  sqlite3_close(db);
}

TEST(StateStoreTest, ADatabaseWithoutTheOwnerColumnGainsItAndKeepsItsJobs) {
  const std::string dir = testing::MakeTempDir("store-owner");
  {
    auto store = StateStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->SaveJob(EndedJob("old", 100), 1).ok());
  }
  // As a coordinator from before job owners left it.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir + "/ddp.sqlite").c_str(), &db), SQLITE_OK);
  EXPECT_EQ(sqlite3_exec(db, "ALTER TABLE jobs DROP COLUMN owner", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);

  auto store = StateStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  v1::Job owned = EndedJob("new", 200);
  owned.set_owner("alice");
  ASSERT_TRUE((*store)->SaveJob(owned, 2).ok());
  auto loaded = (*store)->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->jobs.size(), 2u);
  EXPECT_EQ(loaded->jobs[0].job.id(), "old");
  EXPECT_EQ(loaded->jobs[0].job.owner(), "");
  EXPECT_EQ(loaded->jobs[1].job.owner(), "alice");
}

TEST(StateStoreTest, ABatchNumberIsStoredWithItsEventsOrNotAtAll) {
  const std::string dir = testing::MakeTempDir("store-batches");
  auto store = StateStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  StateStore& s = **store;
  auto line = [](int64_t seq) {
    v1::LogLine l;
    l.set_seq(seq);
    l.set_attempt(1);
    l.set_text(absl::StrCat("line ", seq));
    return l;
  };
  auto marks = [&] {
    auto loaded = s.Load();
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    std::vector<std::string> out;
    if (!loaded.ok()) return out;
    for (const BatchMark& m : loaded->batch_marks) {
      out.push_back(absl::StrCat(m.worker, "/", m.incarnation, "/", m.batch_seq));
    }
    return out;
  };
  ASSERT_TRUE(s.AppendAll({{"j", {}, {}, {line(1)}}, {"k", {}, {}, {line(1)}}},
                          {{"w1", "inc1", 1}})
                  .ok());
  EXPECT_THAT(marks(), ElementsAre("w1/inc1/1"));

  // A commit that fails takes the number with it.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir + "/ddp.sqlite").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "CREATE TRIGGER refuse BEFORE INSERT ON logs WHEN NEW.job_id = 'k' BEGIN"
                         " SELECT RAISE(FAIL, 'database or disk is full'); END;",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  EXPECT_FALSE(s.AppendAll({{"j", {}, {}, {line(2)}}, {"k", {}, {}, {line(2)}}},
                           {{"w1", "inc1", 2}})
                   .ok());
  EXPECT_THAT(marks(), ElementsAre("w1/inc1/1"));
  auto logs = s.ReadLogs("j", 0, std::nullopt, 100);
  ASSERT_TRUE(logs.ok());
  EXPECT_EQ(logs->size(), 1u) << "nor did job j's line of that batch stay";
  ASSERT_EQ(sqlite3_exec(db, "DROP TRIGGER refuse", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);

  // Within an incarnation the number only grows; another incarnation starts anew.
  ASSERT_TRUE(s.AppendAll({{"j", {}, {}, {line(2)}}}, {{"w1", "inc1", 2}}).ok());
  ASSERT_TRUE(s.AppendAll({}, {{"w1", "inc1", 1}, {"w2", "a", 7}}).ok());
  EXPECT_THAT(marks(), ElementsAre("w1/inc1/2", "w2/a/7"));
  ASSERT_TRUE(s.AppendAll({}, {{"w1", "inc2", 1}}).ok());
  EXPECT_THAT(marks(), ElementsAre("w1/inc2/1", "w2/a/7"));
  // Removing a worker forgets its number.
  RowBatch removal;
  removal.removed_workers.push_back("w2");
  ASSERT_TRUE(s.Write(removal).ok());
  EXPECT_THAT(marks(), ElementsAre("w1/inc2/1"));
}

TEST(StateStoreTest, RetentionBoundsBelowOneAreRejected) {
  const std::string dir = testing::MakeTempDir("store-bounds");
  RetentionOptions retention;
  retention.retain_jobs = 0;
  EXPECT_THAT(StateStore::Open(dir, retention),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--retain-jobs: must be >= 1 (got 0)")));
  retention = RetentionOptions();
  retention.max_log_lines = -5;
  EXPECT_THAT(ValidateRetention(retention),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--max-log-lines")));
  retention = RetentionOptions();
  retention.max_metric_rows = 0;
  EXPECT_THAT(ValidateRetention(retention),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--max-metric-rows")));
  EXPECT_TRUE(ValidateRetention(RetentionOptions()).ok());
}

TEST(StateStoreTest, ASecondStoreOnTheSameDirectoryIsRefusedUntilTheFirstCloses) {
  const std::string dir = testing::MakeTempDir("store-lock");
  auto first = StateStore::Open(dir);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_THAT(StateStore::Open(dir),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr(absl::StrCat("state dir ", dir,
                                              " is in use by another ddp-coordinator (pid ",
                                              ::getpid(), "?)"))));
  first->reset();
  EXPECT_TRUE(StateStore::Open(dir).ok()) << "the lock goes with the store";
}

}  // namespace
}  // namespace ddp
