// The ingest queue on a real hub and SQLite store: every batch is answered, only once
// its events are stored, in the order batches were posted.
#include "coordinator/core/ingest_queue.h"

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "coordinator/store/state_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace ddp {
namespace {

std::vector<v1::ReportedEvent> Lines(const std::string& job, int first, int count) {
  std::vector<v1::ReportedEvent> events;
  for (int i = first; i < first + count; ++i) {
    v1::ReportedEvent& e = events.emplace_back();
    e.set_job_id(job);
    e.set_attempt(1);
    e.mutable_log()->set_stream("stdout");
    e.mutable_log()->set_text(absl::StrCat("line ", i));
  }
  return events;
}

TEST(IngestQueueTest, EveryBatchIsAnsweredOnceStoredAndInOrder) {
  const std::string dir = testing::MakeTempDir("ingest");
  {
    auto store = StateStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    FakeClock clock;
    EventHub hub(store->get(), &clock, EventHub::Options{});
    IngestQueue queue(&hub);
    constexpr int kBatches = 200;
    absl::Mutex mu;
    int answered = 0;
    int stored_when_answered_min = 1 << 30;
    for (int b = 0; b < kBatches; ++b) {
      queue.Post(Lines(b % 2 ? "odd" : "even", b * 10, 10), [&, b](absl::Status stored) {
        EXPECT_TRUE(stored.ok()) << stored;
        // The batch's own last line is in SQLite by the time it is answered.
        auto lines = (*store)->ReadLogs(b % 2 ? "odd" : "even", 0, std::nullopt, 100000);
        absl::MutexLock lock(&mu);
        ++answered;
        if (lines.ok()) {
          stored_when_answered_min =
              std::min(stored_when_answered_min, static_cast<int>(lines->size()) - 10 * (b / 2));
        }
      });
    }
    {
      absl::MutexLock lock(&mu);
      auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return answered == kBatches; };
      mu.Await(absl::Condition(&all));
      EXPECT_GE(stored_when_answered_min, 10) << "answered before its lines were stored";
    }
    auto even = (*store)->ReadLogs("even", 0, std::nullopt, 100000);
    ASSERT_TRUE(even.ok());
    ASSERT_EQ(even->size(), 1000u);
    for (size_t i = 0; i < even->size(); ++i) {
      const int batch = static_cast<int>(i) / 10 * 2;
      EXPECT_EQ((*even)[i].text(), absl::StrCat("line ", batch * 10 + static_cast<int>(i) % 10));
      EXPECT_EQ((*even)[i].seq(), static_cast<int64_t>(i) + 1);
    }
    EXPECT_LE(queue.stats().ingests, kBatches) << "batches that queued together share an ingest";
    EXPECT_EQ(queue.stats().batches, kBatches);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ddp
