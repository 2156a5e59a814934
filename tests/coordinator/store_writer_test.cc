// The store writer on a real SQLite store: group commit, order, waiting for a
// commit, and what happens when a commit fails.
#include "coordinator/store/store_writer.h"
#include "coordinator/store/state_store.h"
#include "coordinator/store/store_tables.h"

#include <sqlite3.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/text_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/common/test_util.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::HasSubstr;

v1::Job Job(const std::string& id, v1::JobState state = v1::PENDING) {
  v1::Job job;
  job.set_id(id);
  job.set_name(id);
  job.set_rdzv_id(id);
  job.set_state(state);
  return job;
}

v1::RankAssignment Rank(int rank, int pid) {
  v1::RankAssignment r;
  r.set_rank(rank);
  r.set_worker(absl::StrCat("w", rank));
  r.set_pid(pid);
  return r;
}

class StoreWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("store-writer");
    auto store = StateStore::Open(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    StoreWriter::Options options;
    options.retry_min = absl::Milliseconds(1);
    options.retry_max = absl::Milliseconds(10);
    writer_ = std::make_unique<StoreWriter>(store_.get(), options);
  }

  void TearDown() override {
    writer_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  // As another connection (an operator) would.
  void RunSql(const std::string& sql) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir_ + "/ddp.sqlite").c_str(), &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 10000);  // The coordinator's store writer may be committing.
    char* err = nullptr;
    EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << err;
    sqlite3_free(err);
    sqlite3_close(db);
  }

  LoadedState Load() {
    auto loaded = store_->Load();
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded.ok() ? *std::move(loaded) : LoadedState();
  }

  std::string dir_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<StoreWriter> writer_;
};

TEST_F(StoreWriterTest, ManyChangesShareFewCommitsAndTheLastCopyOfARowWins) {
  v1::Job job = Job("j");
  writer_->PutJob(job, 1);
  v1::Attempt attempt;
  attempt.set_number(1);
  attempt.set_state(v1::RENDEZVOUS);
  writer_->PutAttempt("j", attempt);
  for (int rank = 0; rank < 1000; ++rank) writer_->PutRank("j", 1, Rank(rank, 0));
  for (int rank = 0; rank < 1000; ++rank) writer_->PutRank("j", 1, Rank(rank, 5000 + rank));
  job.set_state(v1::RUNNING);
  const StoreWriter::Ticket last = writer_->PutJob(job, 1);
  EXPECT_EQ(last, 2003u);
  ASSERT_TRUE(writer_->Wait(last).ok());
  const StoreWriter::Stats stats = writer_->stats();
  EXPECT_EQ(stats.rows_staged, 2003);
  EXPECT_LT(stats.commits, 2003) << "grouped, not one transaction per row";
  LoadedState loaded = Load();
  ASSERT_EQ(loaded.jobs.size(), 1u);
  EXPECT_EQ(loaded.jobs[0].job.state(), v1::RUNNING);
  ASSERT_EQ(loaded.jobs[0].job.attempts(0).ranks_size(), 1000);
  EXPECT_EQ(loaded.jobs[0].job.attempts(0).ranks(999).pid(), 5999);
}

v1::Worker Worker(const std::string& name, v1::WorkerMaintenance maintenance) {
  v1::Worker w;
  w.set_name(name);
  w.set_incarnation(name + "-inc");
  w.set_slots(1);
  w.set_maintenance(maintenance);
  w.set_drain_policy(v1::DRAIN_NOW);
  w.set_maintenance_since_ms(1234);
  w.set_maintenance_by("alice");
  return w;
}

TEST_F(StoreWriterTest, WorkerRowsAndRemovalsLandInTheOrderTheyWereStaged) {
  // However the writer groups them into commits: the last word on each name wins.
  writer_->PutWorker(Worker("gone", v1::WORKER_CORDONED));
  writer_->RemoveWorker("gone");
  writer_->PutWorker(Worker("back", v1::WORKER_SCHEDULABLE));
  writer_->RemoveWorker("back");
  writer_->PutWorker(Worker("back", v1::WORKER_DRAINING));
  writer_->RemoveWorker("never-stored");
  ASSERT_TRUE(writer_->Flush().ok());
  LoadedState loaded = Load();
  ASSERT_EQ(loaded.workers.size(), 1u);
  const v1::Worker& w = loaded.workers[0];
  EXPECT_EQ(w.name(), "back");
  EXPECT_EQ(w.maintenance(), v1::WORKER_DRAINING);
  EXPECT_EQ(w.drain_policy(), v1::DRAIN_NOW);
  EXPECT_EQ(w.maintenance_since_ms(), 1234);
  EXPECT_EQ(w.maintenance_by(), "alice");
}

TEST_F(StoreWriterTest, AFailedCommitRetriesWorkerRowsUnlessNewerOnesOverrideThem) {
  ASSERT_TRUE(writer_->Wait(writer_->PutWorker(Worker("a", v1::WORKER_SCHEDULABLE))).ok());
  ASSERT_TRUE(writer_->Wait(writer_->PutWorker(Worker("b", v1::WORKER_SCHEDULABLE))).ok());
  // Every worker write fails until the trigger goes, as on a full disk.
  RunSql("CREATE TRIGGER refuse BEFORE INSERT ON workers BEGIN"
         " SELECT RAISE(FAIL, 'database or disk is full'); END;");
  RunSql("CREATE TRIGGER refuse_delete BEFORE DELETE ON workers BEGIN"
         " SELECT RAISE(FAIL, 'database or disk is full'); END;");
  writer_->RemoveWorker("a");
  const StoreWriter::Ticket failed = writer_->PutWorker(Worker("b", v1::WORKER_CORDONED));
  EXPECT_FALSE(writer_->Wait(failed).ok());
  // Newer word while the failed rows wait: `a` comes back, `b` goes.
  writer_->PutWorker(Worker("a", v1::WORKER_CORDONED));
  writer_->RemoveWorker("b");
  RunSql("DROP TRIGGER refuse; DROP TRIGGER refuse_delete;");
  ASSERT_TRUE(writer_->Flush().ok());
  LoadedState loaded = Load();
  ASSERT_EQ(loaded.workers.size(), 1u);
  EXPECT_EQ(loaded.workers[0].name(), "a");
  EXPECT_EQ(loaded.workers[0].maintenance(), v1::WORKER_CORDONED);
}

TEST_F(StoreWriterTest, AJobRowCarriesNoAttempts) {
  v1::Job job = Job("j");
  job.add_attempts()->set_number(1);
  ASSERT_TRUE(writer_->Wait(writer_->PutJob(job, 1)).ok());
  LoadedState loaded = Load();
  ASSERT_EQ(loaded.jobs.size(), 1u);
  EXPECT_TRUE(loaded.jobs[0].job.attempts().empty()) << "attempts are rows of their own";
}

// Gives every singular scalar field of `m` a value of its own, none its default (the
// n-th field n, "text-n", true, or the enum's last value).
void FillScalars(google::protobuf::Message& m) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const google::protobuf::Reflection* r = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) continue;
    const int n = i + 2;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: r->SetInt32(&m, f, n); break;
      case FieldDescriptor::CPPTYPE_INT64: r->SetInt64(&m, f, 1000 * n); break;
      case FieldDescriptor::CPPTYPE_UINT32: r->SetUInt32(&m, f, n); break;
      case FieldDescriptor::CPPTYPE_UINT64: r->SetUInt64(&m, f, n); break;
      case FieldDescriptor::CPPTYPE_DOUBLE: r->SetDouble(&m, f, n + 0.5); break;
      case FieldDescriptor::CPPTYPE_FLOAT: r->SetFloat(&m, f, n + 0.5f); break;
      case FieldDescriptor::CPPTYPE_BOOL: r->SetBool(&m, f, true); break;
      case FieldDescriptor::CPPTYPE_STRING: r->SetString(&m, f, absl::StrCat("text-", n)); break;
      case FieldDescriptor::CPPTYPE_ENUM: {
        const google::protobuf::EnumDescriptor* e = f->enum_type();
        r->SetEnum(&m, f, e->value(e->value_count() - 1));
        break;
      }
      default: break;  // Messages: none is a column of these tables.
    }
  }
}

std::string FieldText(const google::protobuf::Message& m,
                      const google::protobuf::FieldDescriptor* f) {
  std::string out;
  google::protobuf::TextFormat::PrintFieldValueToString(m, f, -1, &out);
  return out;
}

// Every column of `table` that is a singular field of `want` holds the same value in
// `got`; returns how many were compared.
int ExpectColumnsEqual(const store::TableInfo& table, const google::protobuf::Message& want,
                       const google::protobuf::Message& got) {
  int compared = 0;
  for (const store::ColumnInfo& c : table.columns) {
    const google::protobuf::FieldDescriptor* f = want.GetDescriptor()->FindFieldByName(c.name);
    if (f == nullptr || f->is_repeated()) continue;
    ++compared;
    EXPECT_EQ(FieldText(got, f), FieldText(want, f)) << table.name << "." << c.name;
  }
  return compared;
}

// What the writer stages is what the tables store, column by column: a field added to
// a table's description is written and read back without a copy of its own to keep
// (a job's max_recoveries and recoveries, an attempt's generation, preempted flag and
// recoveries were once dropped, and a restarted coordinator ran a job with
// max_recoveries 0).
TEST_F(StoreWriterTest, EveryColumnOfAJobAndAnAttemptComesBackAsStaged) {
  v1::Job job;
  FillScalars(job);
  job.set_id("j");
  job.set_state(v1::RUNNING);
  v1::Attempt attempt;
  FillScalars(attempt);
  attempt.set_number(1);
  attempt.set_state(v1::RUNNING);
  v1::Recovery* recovery = attempt.add_recoveries();
  recovery->set_generation(1);
  recovery->set_start_ms(5000);
  recovery->set_end_ms(6000);
  recovery->set_outcome("recovered");
  recovery->set_cause("rank 1 killed by SIGKILL");
  recovery->add_ranks(1);
  recovery->set_source_rank(2);
  recovery->set_global_step(412);
  *job.add_attempts() = attempt;
  writer_->PutJob(job, 7);
  ASSERT_TRUE(writer_->Wait(writer_->PutAttempt("j", attempt)).ok());

  LoadedState loaded = Load();
  ASSERT_EQ(loaded.jobs.size(), 1u);
  EXPECT_EQ(loaded.jobs[0].seq, 7);
  const v1::Job& got = loaded.jobs[0].job;
  EXPECT_GE(ExpectColumnsEqual(store::Jobs(), job, got), 20);
  EXPECT_EQ(got.max_recoveries(), job.max_recoveries());
  EXPECT_NE(got.recoveries(), 0);
  EXPECT_NE(got.last_checkpoint_ms(), 0);  // What preemption weighs (decision 188).
  EXPECT_EQ(got.last_checkpoint_step(), job.last_checkpoint_step());
  ASSERT_EQ(got.attempts_size(), 1);
  const v1::Attempt& a = got.attempts(0);
  EXPECT_GE(ExpectColumnsEqual(store::Attempts(), attempt, a), 10);
  EXPECT_NE(a.generation(), 0);
  EXPECT_TRUE(a.preempted());
  ASSERT_EQ(a.recoveries_size(), 1);
  EXPECT_EQ(a.recoveries(0).ShortDebugString(), recovery->ShortDebugString());
}

TEST_F(StoreWriterTest, AfterCommitRunsOnceTheRowsAreStored) {
  const StoreWriter::Ticket ticket = writer_->PutJob(Job("j"), 1);
  absl::Notification done;
  std::atomic<size_t> jobs_seen{99};
  writer_->AfterCommit(ticket, [&](const absl::Status& st) {
    EXPECT_TRUE(st.ok()) << st;
    jobs_seen = Load().jobs.size();
    done.Notify();
  });
  done.WaitForNotification();
  EXPECT_EQ(jobs_seen, 1u);
  bool ran_inline = false;
  writer_->AfterCommit(ticket, [&](const absl::Status&) { ran_inline = true; });
  EXPECT_TRUE(ran_inline) << "already committed: runs at once";
}

TEST_F(StoreWriterTest, ARefusedSubmissionIsReportedAndDroppedWhileOtherRowsAreRetried) {
  ASSERT_TRUE(writer_->Wait(writer_->PutJob(Job("old"), 1)).ok());
  // Inserts of new jobs fail, as on a full disk; updates of known rows go through.
  RunSql("CREATE TRIGGER refuse BEFORE INSERT ON jobs WHEN NEW.id = 'new' BEGIN"
         " SELECT RAISE(FAIL, 'database or disk is full'); END;");
  writer_->PutRank("old", 1, Rank(0, 42));
  const StoreWriter::Ticket ticket = writer_->PutJob(Job("new"), 2, /*creation=*/true);
  EXPECT_THAT(writer_->Wait(ticket),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("database or disk is full")));
  // The rank row was in the failed commit: retried without the refused job, it lands.
  const StoreWriter::Ticket after = writer_->PutJob(Job("old", v1::RUNNING), 1);
  ASSERT_TRUE(writer_->Wait(after).ok());
  LoadedState loaded = Load();
  ASSERT_EQ(loaded.jobs.size(), 1u);
  EXPECT_EQ(loaded.jobs[0].job.id(), "old");
  EXPECT_EQ(loaded.jobs[0].job.state(), v1::RUNNING);
  EXPECT_GE(writer_->stats().failed_commits, 1);
}

TEST_F(StoreWriterTest, RetentionRunsAfterTheRowsStagedBeforeItAndDropsThoseStillStaged) {
  ASSERT_TRUE(writer_->Wait(writer_->PutJob(Job("gone", v1::SUCCEEDED), 1)).ok());
  writer_->PutJob(Job("kept"), 2);
  writer_->PutRank("gone", 1, Rank(0, 7));  // A late row of the job being deleted.
  absl::Notification done;
  absl::Status result;
  writer_->EnforceRetention({"gone"}, [&](const absl::Status& st) {
    result = st;
    done.Notify();
  });
  done.WaitForNotification();
  ASSERT_TRUE(result.ok()) << result;
  ASSERT_TRUE(writer_->Flush().ok());
  LoadedState loaded = Load();
  ASSERT_EQ(loaded.jobs.size(), 1u);
  EXPECT_EQ(loaded.jobs[0].job.id(), "kept");
}

TEST_F(StoreWriterTest, DestroyingTheWriterCommitsWhatIsStaged) {
  for (int i = 0; i < 50; ++i) writer_->PutJob(Job(absl::StrCat("j", i)), i + 1);
  writer_.reset();
  EXPECT_EQ(Load().jobs.size(), 50u);
}

}  // namespace
}  // namespace ddp
