// One contract, three stores: the same checks run on the SQLite StateStore, on the
// PostgresStore against a real PostgreSQL server, and on the tests' in-memory fake, so
// the facade's tests, which run on the fake, meet the behaviour the daemon has.
// (SQLite's own matters, schema migrations, the directory lock, are
// state_store_test's; PostgreSQL's, the lease and its fencing, postgres_store_test's.)
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/store/postgres_store.h"
#include "coordinator/store/state_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/postgres_server.h"
#include "tests/common/test_util.h"
#include "tests/coordinator/memory_store.h"

namespace ddp {
namespace {

using ::testing::ElementsAre;

enum class Kind { kSqlite, kPostgres, kMemory };

class StoreContractTest : public ::testing::TestWithParam<Kind> {
 protected:
  // One server for the suite; a database of its own per test.
  static void SetUpTestSuite() {
    auto server = testing::PostgresServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    postgres_ = server->release();
  }
  static void TearDownTestSuite() {
    delete postgres_;
    postgres_ = nullptr;
  }

  void SetUp() override { Open(); }

  // (Re)opens the store on the same state: a coordinator restart.
  void Open() {
    if (auto* pg = dynamic_cast<PostgresStore*>(store_.get())) {
      ASSERT_TRUE(pg->Release(pg->fence()).ok()) << "the next one leads at once";
    }
    store_.reset();
    if (GetParam() == Kind::kPostgres) {
      if (database_.empty()) {
        database_ = absl::StrCat("contract", ++databases_);
        ASSERT_TRUE(postgres_->CreateDatabase(database_).ok());
      }
      auto store = PostgresStore::Open({postgres_->uri(database_), retention_});
      ASSERT_TRUE(store.ok()) << store.status();
      auto epoch = (*store)->TryAcquire("contract-test", "127.0.0.1:1", absl::Seconds(30));
      ASSERT_TRUE(epoch.ok()) << epoch.status();
      ASSERT_TRUE(epoch->has_value()) << "the lease was released";
      (*store)->SetFence(**epoch);
      store_ = std::move(*store);
    } else if (GetParam() == Kind::kSqlite) {
      if (dir_.empty()) dir_ = testing::MakeTempDir("store-contract");
      auto store = StateStore::Open(dir_, retention_);
      ASSERT_TRUE(store.ok()) << store.status();
      store_ = std::move(*store);
    } else {
      auto store = std::make_unique<testing::MemoryStore>(retention_, data_);
      data_ = store->data();
      store_ = std::move(store);
    }
  }

  static v1::Job Job(const std::string& id) {
    v1::Job job;
    job.set_id(id);
    job.set_name(id);
    job.set_rdzv_id(id);
    job.set_state(v1::RUNNING);
    v1::Attempt* a = job.add_attempts();
    a->set_number(1);
    a->set_state(v1::RUNNING);
    for (int r = 0; r < 2; ++r) {
      v1::RankAssignment* rank = a->add_ranks();
      rank->set_rank(r);
      rank->set_worker(absl::StrCat("w", r + 1));
    }
    return job;
  }

  static v1::LogLine Line(int64_t seq, int rank, const std::string& text) {
    v1::LogLine l;
    l.set_seq(seq);
    l.set_attempt(1);
    l.set_rank(rank);
    l.set_stream("stdout");
    l.set_text(text);
    return l;
  }

  static v1::RankMetrics Step(int attempt, int rank, int64_t global_step) {
    v1::RankMetrics m;
    m.set_attempt(attempt);
    m.set_rank(rank);
    m.set_global_step(global_step);
    m.set_loss(1.0 / static_cast<double>(global_step));
    return m;
  }

  static testing::PostgresServer* postgres_;
  static int databases_;
  std::string database_;
  std::string dir_;
  std::shared_ptr<testing::MemoryStore::Data> data_;
  RetentionOptions retention_;
  std::unique_ptr<Store> store_;
};

testing::PostgresServer* StoreContractTest::postgres_ = nullptr;
int StoreContractTest::databases_ = 0;

TEST_P(StoreContractTest, RowsAreUpsertedByKeyAndLoadedInOrderAfterARestart) {
  ASSERT_TRUE(store_->SaveJob(Job("b"), 2).ok());
  ASSERT_TRUE(store_->SaveJob(Job("a"), 1).ok());
  RowBatch batch;  // One rank changed: its row alone.
  v1::RankAssignment rank = Job("a").attempts(0).ranks(1);
  rank.set_pid(77);
  batch.ranks.push_back({"a", 1, rank});
  v1::Worker w2, w1;
  w2.set_name("w2");
  w1.set_name("w1");
  w1.set_slots(4);
  batch.workers = {w2, w1};
  ASSERT_TRUE(store_->Write(batch).ok());
  Open();
  auto loaded = store_->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->cluster_id.size(), 32u) << "made once, kept";
  const std::string cluster_id = loaded->cluster_id;
  Open();
  EXPECT_EQ(store_->Load()->cluster_id, cluster_id);
  ASSERT_EQ(loaded->jobs.size(), 2u);
  EXPECT_EQ(loaded->jobs[0].job.id(), "a") << "in submission order";
  EXPECT_EQ(loaded->jobs[0].seq, 1);
  ASSERT_EQ(loaded->jobs[0].job.attempts_size(), 1);
  ASSERT_EQ(loaded->jobs[0].job.attempts(0).ranks_size(), 2);
  EXPECT_EQ(loaded->jobs[0].job.attempts(0).ranks(0).worker(), "w1");
  EXPECT_EQ(loaded->jobs[0].job.attempts(0).ranks(1).pid(), 77);
  ASSERT_EQ(loaded->workers.size(), 2u);
  EXPECT_EQ(loaded->workers[0].name(), "w1") << "by name";
  EXPECT_EQ(loaded->workers[0].slots(), 4);
}

TEST_P(StoreContractTest, BatchMarksKeepTheHighestNumberPerIncarnationAndGoWithTheirWorker) {
  v1::Worker w;
  w.set_name("w1");
  ASSERT_TRUE(store_->SaveWorker(w).ok());
  ASSERT_TRUE(store_->AppendAll({}, {{"w1", "inc1", 5}}).ok());
  ASSERT_TRUE(store_->AppendAll({}, {{"w1", "inc1", 3}}).ok()) << "an older batch re-sent";
  auto loaded = store_->Load();
  ASSERT_TRUE(loaded.ok());
  ASSERT_EQ(loaded->batch_marks.size(), 1u);
  EXPECT_EQ(loaded->batch_marks[0].batch_seq, 5);
  ASSERT_TRUE(store_->AppendAll({}, {{"w1", "inc2", 1}}).ok()) << "the agent restarted";
  loaded = store_->Load();
  ASSERT_EQ(loaded->batch_marks.size(), 1u);
  EXPECT_EQ(loaded->batch_marks[0].incarnation, "inc2");
  EXPECT_EQ(loaded->batch_marks[0].batch_seq, 1);
  RowBatch remove;
  remove.removed_workers.push_back("w1");
  ASSERT_TRUE(store_->Write(remove).ok());
  loaded = store_->Load();
  EXPECT_TRUE(loaded->workers.empty());
  EXPECT_TRUE(loaded->batch_marks.empty());
}

TEST_P(StoreContractTest, LogsAreReadAfterASeqByRankWithALimitOrATail) {
  ASSERT_TRUE(store_->SaveJob(Job("j"), 1).ok());
  std::vector<v1::LogLine> lines;
  for (int64_t seq = 1; seq <= 10; ++seq) lines.push_back(Line(seq, seq % 2, absl::StrCat("l", seq)));
  ASSERT_TRUE(store_->Append("j", {}, {}, lines).ok());
  auto texts = [](const absl::StatusOr<std::vector<v1::LogLine>>& got) {
    std::vector<std::string> out;
    if (got.ok()) {
      for (const v1::LogLine& l : *got) out.push_back(l.text());
    }
    return out;
  };
  EXPECT_THAT(texts(store_->ReadLogs("j", 7, std::nullopt, 100)), ElementsAre("l8", "l9", "l10"));
  EXPECT_THAT(texts(store_->ReadLogs("j", 0, 1, 2)), ElementsAre("l1", "l3"));
  EXPECT_THAT(texts(store_->ReadLogs("j", 0, std::nullopt, 100, /*tail=*/2)),
              ElementsAre("l9", "l10"));
  EXPECT_THAT(texts(store_->ReadLogs("j", 0, 0, 3, /*tail=*/5)), ElementsAre("l6", "l8", "l10"))
      << "a tail within the limit";
  EXPECT_EQ(store_->MaxLogSeq("j").value_or(-1), 10);
  EXPECT_EQ(store_->MaxLogSeq("other").value_or(-1), 0);
  Open();
  auto loaded = store_->Load();
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->jobs[0].log_bytes, 21) << "l1..l9 and l10: the bytes of text kept";
}

TEST_P(StoreContractTest, MetricsAndEpochsComeBackInTheirOrder) {
  ASSERT_TRUE(store_->SaveJob(Job("j"), 1).ok());
  v1::EpochSummary e0, e1, e0again;
  e0.set_attempt(1);
  e0.set_epoch(0);
  e0.set_train_loss(2.0);
  e1.set_attempt(1);
  e1.set_epoch(1);
  e1.set_train_loss(1.0);
  e0again = e0;
  e0again.set_train_loss(1.5);  // The same (attempt, epoch) again: replaces it.
  ASSERT_TRUE(store_->Append("j", {Step(1, 1, 2), Step(1, 0, 2), Step(1, 0, 1), Step(2, 0, 1)},
                             {e1, e0}, {})
                  .ok());
  ASSERT_TRUE(store_->Append("j", {Step(1, 1, 3)}, {e0again}, {}).ok());
  auto latest = store_->LatestMetrics("j", 1);
  ASSERT_TRUE(latest.ok());
  ASSERT_EQ(latest->size(), 2u);
  EXPECT_EQ((*latest)[0].rank(), 0);
  EXPECT_EQ((*latest)[0].global_step(), 2);
  EXPECT_EQ((*latest)[1].global_step(), 3);
  auto history = store_->MetricHistory("j");
  ASSERT_TRUE(history.ok());
  std::vector<std::tuple<int, int64_t, int>> order;
  for (const v1::RankMetrics& m : *history) order.emplace_back(m.attempt(), m.global_step(), m.rank());
  EXPECT_THAT(order, ElementsAre(std::make_tuple(1, 1, 0), std::make_tuple(1, 2, 0),
                                 std::make_tuple(1, 2, 1), std::make_tuple(1, 3, 1),
                                 std::make_tuple(2, 1, 0)));
  auto epochs = store_->Epochs("j");
  ASSERT_TRUE(epochs.ok());
  ASSERT_EQ(epochs->size(), 2u);
  EXPECT_EQ((*epochs)[0].epoch(), 0);
  EXPECT_EQ((*epochs)[0].train_loss(), 1.5);
  EXPECT_EQ((*epochs)[1].epoch(), 1);
}

TEST_P(StoreContractTest, RetentionDeletesJobsWholeAndKeepsTheNewestOutput) {
  retention_.max_metric_rows = 3;
  retention_.max_log_lines = 2;
  Open();
  ASSERT_TRUE(store_->SaveJob(Job("gone"), 1).ok());
  ASSERT_TRUE(store_->SaveJob(Job("kept"), 2).ok());
  std::vector<v1::RankMetrics> steps;
  for (int64_t s = 1; s <= 5; ++s) steps.push_back(Step(1, 0, s));
  ASSERT_TRUE(store_->Append("gone", steps, {}, {Line(1, 0, "x")}).ok());
  ASSERT_TRUE(store_->Append("kept", steps, {}, {Line(1, 0, "a"), Line(2, 0, "b"), Line(3, 0, "c")})
                  .ok());
  ASSERT_TRUE(store_->EnforceRetention({"gone"}).ok());
  auto loaded = store_->Load();
  ASSERT_TRUE(loaded.ok());
  ASSERT_EQ(loaded->jobs.size(), 1u);
  EXPECT_EQ(loaded->jobs[0].job.id(), "kept");
  auto gone_steps = store_->MetricHistory("gone");
  ASSERT_TRUE(gone_steps.ok());
  EXPECT_TRUE(gone_steps->empty());
  auto gone_lines = store_->ReadLogs("gone", 0, std::nullopt, 100);
  ASSERT_TRUE(gone_lines.ok());
  EXPECT_TRUE(gone_lines->empty());
  auto steps_kept = store_->MetricHistory("kept");
  ASSERT_TRUE(steps_kept.ok());
  std::vector<int64_t> kept_steps;
  for (const v1::RankMetrics& m : *steps_kept) kept_steps.push_back(m.global_step());
  EXPECT_THAT(kept_steps, ElementsAre(3, 4, 5));
  auto lines_kept = store_->ReadLogs("kept", 0, std::nullopt, 100);
  ASSERT_TRUE(lines_kept.ok());
  std::vector<std::string> kept_lines;
  for (const v1::LogLine& l : *lines_kept) kept_lines.push_back(l.text());
  EXPECT_THAT(kept_lines, ElementsAre("b", "c"));
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreContractTest,
                         ::testing::Values(Kind::kSqlite, Kind::kPostgres, Kind::kMemory),
                         [](const ::testing::TestParamInfo<Kind>& info) {
                           switch (info.param) {
                             case Kind::kSqlite: return std::string("Sqlite");
                             case Kind::kPostgres: return std::string("Postgres");
                             case Kind::kMemory: return std::string("Memory");
                           }
                           return std::string();
                         });

}  // namespace
}  // namespace ddp
