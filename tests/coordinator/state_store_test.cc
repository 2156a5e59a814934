// The state store on a real SQLite database in a scratch directory: retention, and
// the exclusive hold a store takes on its directory.
#include "coordinator/state_store.h"

#include <sqlite3.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
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
