// The PostgreSQL store's own behaviour against a real PostgreSQL 15 server: the
// leader's lease and the fencing of every write, schema migrations, bad URIs and
// databases. (What it shares with the other stores is store_contract_test's.)
#include "coordinator/store/postgres_store.h"

#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/ports.h"
#include "tests/common/postgres_server.h"
#include "tests/common/status_matchers.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

class PostgresStoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto server = testing::PostgresServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    database_ = absl::StrCat("t", ++databases_);
    ASSERT_TRUE(server_->CreateDatabase(database_).ok());
  }

  std::unique_ptr<PostgresStore> Open() {
    auto store = PostgresStore::Open({server_->uri(database_)});
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }
  std::string Query(const std::string& sql) { return server_->Query(sql, database_).value_or("?"); }

  static v1::Job Job(const std::string& id) {
    v1::Job job;
    job.set_id(id);
    job.set_state(v1::PENDING);
    return job;
  }

  static testing::PostgresServer* server_;
  static int databases_;
  std::string database_;
};

testing::PostgresServer* PostgresStoreTest::server_ = nullptr;
int PostgresStoreTest::databases_ = 0;

TEST_F(PostgresStoreTest, TheLeaseIsTakenOnlyWhenFreeAndEveryTakeoverRaisesTheEpoch) {
  auto a = Open();
  auto b = Open();
  ASSERT_TRUE(a && b);
  auto none = b->Holder();
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->epoch, 0) << "nobody led yet";
  EXPECT_FALSE(none->live);

  auto first = a->TryAcquire("a", "10.0.0.1:29400", absl::Seconds(30));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ(**first, 1);
  auto refused = b->TryAcquire("b", "10.0.0.2:29400", absl::Seconds(30));
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_FALSE(refused->has_value()) << "a holds it";
  auto holder = b->Holder();
  ASSERT_TRUE(holder.ok());
  EXPECT_EQ(holder->address, "10.0.0.1:29400");
  EXPECT_EQ(holder->holder, "a");
  EXPECT_TRUE(holder->live);
  EXPECT_TRUE(a->Renew(1, absl::Seconds(30)).ok());

  // Released (a leader stopping): taken at the next try.
  ASSERT_TRUE(a->Release(1).ok());
  auto second = b->TryAcquire("b", "10.0.0.2:29400", absl::Seconds(30));
  ASSERT_TRUE(second.ok() && second->has_value());
  EXPECT_EQ(**second, 2);
  EXPECT_THAT(a->Renew(1, absl::Seconds(30)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("lost the lease"), HasSubstr("10.0.0.2:29400"),
                             HasSubstr("epoch 2"))));

  // Expired (a leader that stopped renewing): taken once its time is up, by the
  // database's clock.
  ASSERT_TRUE(b->Renew(2, absl::Milliseconds(300)).ok());
  auto early = a->TryAcquire("a", "10.0.0.1:29400", absl::Seconds(30));
  ASSERT_TRUE(early.ok());
  EXPECT_FALSE(early->has_value());
  absl::SleepFor(absl::Milliseconds(400));
  auto third = a->TryAcquire("a", "10.0.0.1:29400", absl::Seconds(30));
  ASSERT_TRUE(third.ok() && third->has_value());
  EXPECT_EQ(**third, 3);
}

TEST_F(PostgresStoreTest, ADeposedLeaderCanNeverWriteAgain) {
  auto old_leader = Open();
  auto new_leader = Open();
  ASSERT_TRUE(old_leader && new_leader);
  EXPECT_THAT(old_leader->SaveJob(Job("unfenced"), 1),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("holds no lease")))
      << "a store writes only once it leads";
  auto epoch = old_leader->TryAcquire("old", "10.0.0.1:29400", absl::Milliseconds(200));
  ASSERT_TRUE(epoch.ok() && epoch->has_value());
  old_leader->SetFence(**epoch);
  ASSERT_TRUE(old_leader->SaveJob(Job("before"), 1).ok());

  // The old leader pauses past its lease; the other takes over.
  absl::SleepFor(absl::Milliseconds(300));
  auto taken = new_leader->TryAcquire("new", "10.0.0.2:29400", absl::Seconds(30));
  ASSERT_TRUE(taken.ok() && taken->has_value());
  new_leader->SetFence(**taken);

  // Whatever the old one tries now is refused, and says who leads.
  const auto fenced = StatusIs(absl::StatusCode::kFailedPrecondition,
                               AllOf(HasSubstr("fenced"), HasSubstr("10.0.0.2:29400")));
  EXPECT_THAT(old_leader->SaveJob(Job("after"), 2), fenced);
  v1::RankMetrics m;
  m.set_global_step(1);
  EXPECT_THAT(old_leader->AppendAll({JobOutput{"before", {m}, {}, {}}}, {{"w1", "i", 1}}), fenced);
  EXPECT_THAT(old_leader->EnforceRetention({"before"}), fenced);
  EXPECT_EQ(Query("SELECT string_agg(id, ',') FROM jobs"), "before\n");
  EXPECT_EQ(Query("SELECT count(*) FROM metrics"), "0\n");
  EXPECT_EQ(Query("SELECT count(*) FROM worker_batches"), "0\n");

  // The new leader loads what was committed and writes on.
  auto loaded = new_leader->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->jobs.size(), 1u);
  EXPECT_EQ(loaded->jobs[0].job.id(), "before");
  EXPECT_TRUE(new_leader->SaveJob(Job("next"), 2).ok());
}

TEST_F(PostgresStoreTest, CoordinatorsStartedTogetherMigrateOnceAndShareOneClusterId) {
  std::vector<std::unique_ptr<PostgresStore>> stores(4);
  std::vector<std::thread> threads;
  for (auto& s : stores) threads.emplace_back([&] { s = Open(); });
  for (std::thread& t : threads) t.join();
  std::set<std::string> ids;
  for (auto& s : stores) {
    ASSERT_NE(s, nullptr);
    ids.insert(s->cluster_id());
  }
  EXPECT_EQ(ids.size(), 1u);
  EXPECT_EQ(Query("SELECT value FROM meta WHERE key = 'schema_version'"),
            absl::StrCat(kSchemaVersion, "\n"));
  EXPECT_EQ(Query("SELECT count(*) FROM lease"), "1\n");
}

TEST_F(PostgresStoreTest, ADatabaseOfANewerSchemaIsRefusedUntouched) {
  ASSERT_NE(Open(), nullptr);
  ASSERT_TRUE(server_->Query("UPDATE meta SET value = '99' WHERE key = 'schema_version';"
                             " ALTER TABLE jobs DROP COLUMN owner",
                             database_)
                  .ok());
  EXPECT_THAT(PostgresStore::Open({server_->uri(database_)}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("schema version 99"), HasSubstr("newer"),
                             HasSubstr(absl::StrCat("127.0.0.1:", server_->port())))));
  EXPECT_EQ(Query("SELECT value FROM meta WHERE key = 'schema_version'"), "99\n");
  EXPECT_EQ(Query("SELECT count(*) FROM information_schema.columns WHERE table_name = 'jobs'"
                  " AND column_name = 'owner'"),
            "0\n")
      << "no column added back";
}

TEST_F(PostgresStoreTest, ADatabaseHoldingOtherTablesIsRefused) {
  ASSERT_TRUE(server_->Query("CREATE TABLE invoices(id INTEGER)", database_).ok());
  EXPECT_THAT(PostgresStore::Open({server_->uri(database_)}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("not ddp's (invoices)"), HasSubstr("database of their own"))));
  EXPECT_EQ(Query("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"),
            "1\n")
      << "nothing created beside it";
}

TEST_F(PostgresStoreTest, BadUrisAndUnreachableServersAreClearErrors) {
  EXPECT_THAT(PostgresStore::Open({"mysql://db/ddp"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a PostgreSQL URI")));
  EXPECT_THAT(PostgresStore::Open({"postgresql://ddp:s3cret@127.0.0.1:notaport/ddp"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("--store"), ::testing::Not(HasSubstr("s3cret")))));
  auto port = ::ddp::testing::ClaimPort();
  ASSERT_TRUE(port.ok());
  const std::string nowhere = absl::StrCat("postgresql://ddp:s3cret@127.0.0.1:", *port, "/ddp");
  auto st = PostgresStore::Open({nowhere}).status();
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kUnavailable,
                           AllOf(HasSubstr(absl::StrCat("cannot reach the PostgreSQL store at "
                                                        "127.0.0.1:",
                                                        *port, "/ddp")),
                                 HasSubstr("refused"))));
  EXPECT_THAT(std::string(st.message()), ::testing::Not(HasSubstr("s3cret")));
  EXPECT_THAT(PostgresStore::Open({server_->uri("no_such_db")}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no_such_db")));
}

}  // namespace
}  // namespace ddp
