// The shared-memory node group on its own: local ranks are threads of this process
// (each with its own mapping of the segment), the rendezvous store is in memory.
// Real trainer processes, SIGKILL and Gloo between node leaders are covered by
// trainer_shm_test.
#include "libddp/engine/shm_comm.h"

#include <filesystem>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::HasSubstr;

class MemoryRendezvous : public ShmRendezvous {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override {
    absl::MutexLock lock(&mu_);
    values_[key] = value;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(const std::string& key) override {
    absl::MutexLock lock(&mu_);
    auto present = [&] { return values_.count(key) > 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&present), absl::Seconds(30))) {
      return absl::DeadlineExceededError(absl::StrCat("no ", key));
    }
    return values_[key];
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

ShmNodeComm::Options OptionsFor(int local_rank, int local_world, size_t slot_bytes = 4096) {
  ShmNodeComm::Options o;
  o.job_id = "shm-comm-test";
  o.local_rank = local_rank;
  o.local_world = local_world;
  o.slot_bytes = slot_bytes;
  o.timeout = absl::Seconds(60);
  return o;
}

// Runs body(rank, comm) on `world` threads, each with its own ShmNodeComm.
void RunGroup(int world, const std::function<void(int, ShmNodeComm&)>& body,
              const std::function<ShmNodeComm::Options(int)>& options = nullptr) {
  MemoryRendezvous rendezvous;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto comm = ShmNodeComm::Create(options ? options(r) : OptionsFor(r, world), rendezvous);
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(r, **comm);
    });
  }
  for (std::thread& t : threads) t.join();
}

// Values of very different magnitudes, so that another summation order would round
// differently.
template <typename T>
std::vector<T> Data(int rank, size_t n) {
  std::mt19937 gen(1234 + rank);
  std::uniform_real_distribution<double> unit(-1, 1);
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(unit(gen) * std::pow(10.0, (i + rank) % 9));
  return v;
}

template <typename T>
void ExpectSumInLocalRankOrder(int world, size_t n, ShmDType dtype, bool split) {
  std::vector<T> expected = Data<T>(0, n);
  for (int r = 1; r < world; ++r) {
    std::vector<T> d = Data<T>(r, n);
    for (size_t i = 0; i < n; ++i) expected[i] = expected[i] + d[i];
  }
  std::vector<std::vector<T>> results(world);
  RunGroup(
      world,
      [&](int rank, ShmNodeComm& comm) {
        std::vector<T> mine = Data<T>(rank, n);
        absl::Status st = comm.Sum(mine.data(), n, dtype);
        ASSERT_TRUE(st.ok()) << st;
        results[rank] = mine;
      },
      [&](int r) {
        ShmNodeComm::Options o = OptionsFor(r, world);
        if (split) o.whole_chunk_bytes = 0;  // Two ranks always sum whole chunks.
        return o;
      });
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(results[r].size(), n);
    // Bit for bit: every element summed once, in local-rank order.
    EXPECT_EQ(std::memcmp(results[r].data(), expected.data(), n * sizeof(T)), 0) << "rank " << r;
  }
}

TEST(ShmNodeCommTest, SumsAreBitIdenticalAndInLocalRankOrder) {
  // 4096-byte slots: 5000 floats take 5 rounds, the last one short. Each rank sums
  // either whole chunks or its part of them.
  for (int world : {2, 3, 4}) {
    for (bool split : {false, true}) {
      SCOPED_TRACE(absl::StrCat("world ", world, split ? ", parts" : ", whole chunks"));
      ExpectSumInLocalRankOrder<float>(world, 5000, ShmDType::kFloat32, split);
      ExpectSumInLocalRankOrder<double>(world, 777, ShmDType::kFloat64, split);
      // Fewer elements than ranks' parts.
      ExpectSumInLocalRankOrder<float>(world, 3, ShmDType::kFloat32, split);
    }
  }
}

TEST(ShmNodeCommTest, BroadcastCopiesLocalRankZerosBytes) {
  const size_t n = 10001;  // Three rounds of 4096-byte slots.
  RunGroup(3, [&](int rank, ShmNodeComm& comm) {
    std::vector<char> bytes(n, static_cast<char>(rank));
    if (rank == 0) {
      for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>(i * 7);
    }
    ASSERT_TRUE(comm.Broadcast(bytes.data(), n).ok());
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(bytes[i], static_cast<char>(i * 7)) << i;
  });
}

TEST(ShmNodeCommTest, CollectivesStartedTogetherCompleteInOrder) {
  // The reducer's pattern: several buckets started, polled while backward goes on,
  // then waited for; mixed with broadcasts and an empty collective.
  RunGroup(2, [&](int rank, ShmNodeComm& comm) {
    std::vector<std::vector<float>> buckets;
    for (int b = 0; b < 5; ++b) buckets.push_back(std::vector<float>(1500 + b, rank + b));
    std::vector<ShmNodeComm::OpId> ids;
    for (auto& bucket : buckets) {
      ids.push_back(comm.StartSum(bucket.data(), bucket.size(), ShmDType::kFloat32));
      comm.Poll();
    }
    ids.push_back(comm.StartSum(nullptr, 0, ShmDType::kFloat32));
    int64_t flag = rank == 0 ? 42 : -1;
    ids.push_back(comm.StartBroadcast(&flag, sizeof(flag)));
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) ASSERT_TRUE(comm.Wait(*it).ok());
    for (int b = 0; b < 5; ++b) {
      EXPECT_EQ(buckets[b].front(), 2 * b + 1.0f);
      EXPECT_EQ(buckets[b].back(), 2 * b + 1.0f);
    }
    EXPECT_EQ(flag, 42);
  });
}

TEST(ShmNodeCommTest, TheSegmentsNameIsGoneOnceEveryRankMappedIt) {
  RunGroup(3, [&](int rank, ShmNodeComm& comm) {
    // A collective completes only once local rank 0 finished setting up.
    float x = 1;
    ASSERT_TRUE(comm.Sum(&x, 1, ShmDType::kFloat32).ok());
    EXPECT_EQ(x, 3.0f);
    const std::string path = "/dev/shm" + comm.segment_name();
    EXPECT_FALSE(std::filesystem::exists(path)) << path;
    ASSERT_TRUE(comm.Sum(&x, 1, ShmDType::kFloat32).ok());  // Still works: memory is mapped.
    EXPECT_EQ(x, 9.0f);
  });
}

TEST(ShmNodeCommTest, APeerThatLeftFailsTheCollectiveInsteadOfHangingIt) {
  RunGroup(2, [&](int rank, ShmNodeComm& comm) {
    if (rank == 1) return;  // Its ShmNodeComm goes away without taking part.
    float x = 1;
    EXPECT_THAT(comm.Sum(&x, 1, ShmDType::kFloat32),
                StatusIs(absl::StatusCode::kUnavailable, HasSubstr("local rank 1")));
  });
}

TEST(ShmNodeCommTest, AHungPeerFailsTheCollectiveAtTheTimeout) {
  absl::Notification done;
  RunGroup(
      2,
      [&](int rank, ShmNodeComm& comm) {
        if (rank == 1) {
          done.WaitForNotification();  // Alive, never takes part.
          return;
        }
        float x = 1;
        EXPECT_THAT(comm.Sum(&x, 1, ShmDType::kFloat32),
                    StatusIs(absl::StatusCode::kUnavailable,
                             HasSubstr("timed out after train.collective_timeout_s")));
        done.Notify();
      },
      [](int r) {
        ShmNodeComm::Options o = OptionsFor(r, 2);
        o.timeout = absl::Milliseconds(300);
        return o;
      });
}

TEST(ShmNodeCommTest, AFailedRankAbortsEveryPeersCollectives) {
  RunGroup(3, [&](int rank, ShmNodeComm& comm) {
    float x = 1;
    ASSERT_TRUE(comm.Sum(&x, 1, ShmDType::kFloat32).ok());
    if (rank == 2) {
      comm.Abort("the leaders' all-reduce failed");
      return;
    }
    EXPECT_THAT(comm.Sum(&x, 1, ShmDType::kFloat32),
                StatusIs(absl::StatusCode::kUnavailable,
                         HasSubstr("local rank 2 (pid")));
    // Every later collective fails too.
    EXPECT_FALSE(comm.Sum(&x, 1, ShmDType::kFloat32).ok());
  });
}

TEST(ShmNodeCommTest, ALayoutMismatchIsReportedToLocalRankZero) {
  MemoryRendezvous rendezvous;
  std::thread peer([&] {
    ShmNodeComm::Options o = OptionsFor(1, 2, /*slot_bytes=*/8192);  // Disagrees on slots.
    EXPECT_THAT(ShmNodeComm::Create(o, rendezvous),
                StatusIs(absl::StatusCode::kUnavailable, HasSubstr("does not match")));
  });
  auto leader = ShmNodeComm::Create(OptionsFor(0, 2), rendezvous);
  peer.join();
  EXPECT_THAT(leader, StatusIs(absl::StatusCode::kUnavailable,
                               HasSubstr("local rank 1 could not map")));
}

}  // namespace
}  // namespace ddp
