// The checkpoint files on disk: atomic saves under names nobody else picks, the last
// `keep` kept, and only this writer's leftovers cleaned. No LibTorch: bytes only.
#include "libddp/engine/checkpoint_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/common/test_util.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  return names;
}

CheckpointStore Store(const std::string& dir, const std::string& writer, int64_t keep = 2) {
  return CheckpointStore(CheckpointStore::Options{dir, writer, keep, -1});
}

TEST(CheckpointStoreTest, KeepsTheNewestAndNothingElse) {
  const std::string dir = testing::MakeTempDir("store") + "/nested/ckpt";
  CheckpointStore store = Store(dir, "job-a.node-1", /*keep=*/2);
  DDP_ASSERT_OK_AND_ASSIGN(auto none, store.Steps());
  EXPECT_TRUE(none.empty()) << "an absent directory holds nothing";
  for (int64_t step : {5, 10, 15}) {
    ASSERT_THAT(store.Write(step, {'s', char('0' + step / 5)}), ::ddp::testing::IsOk());
  }
  DDP_ASSERT_OK_AND_ASSIGN(auto steps, store.Steps());
  EXPECT_THAT(steps, ElementsAre(10, 15));
  EXPECT_THAT(Names(dir), UnorderedElementsAre("checkpoint-0000000010.pt",
                                               "checkpoint-0000000015.pt"))
      << "no temporaries left";
  DDP_ASSERT_OK_AND_ASSIGN(auto bytes, store.Read(15));
  EXPECT_THAT(bytes, ElementsAre('s', '3'));
  EXPECT_THAT(store.Read(5), StatusIs(absl::StatusCode::kNotFound));
}

TEST(CheckpointStoreTest, IgnoresTemporariesAndOtherFilesWhenListing) {
  const std::string dir = testing::MakeTempDir("store-list");
  testing::WriteFile(dir + "/.checkpoint-0000000099.pt.tmp.job.node.1.00", "torn");
  testing::WriteFile(dir + "/checkpoint-x.pt", "");
  testing::WriteFile(dir + "/notes.txt", "");
  testing::WriteFile(dir + "/checkpoint-0000000007.pt", "ok");
  DDP_ASSERT_OK_AND_ASSIGN(auto steps, Store(dir, "w").Steps());
  EXPECT_THAT(steps, ElementsAre(7));
}

TEST(CheckpointStoreTest, RemovesOnlyItsOwnTemporaries) {
  const std::string dir = testing::MakeTempDir("store-tmp");
  testing::WriteFile(dir + "/.checkpoint-0000000020.pt.tmp.job-a.node-1.4242.0123456789abcdef",
                     "mine, killed midway");
  testing::WriteFile(dir + "/.checkpoint-0000000020.pt.tmp.job-a.node-2.4243.0123456789abcdef",
                     "another node's save, maybe in progress on shared storage");
  testing::WriteFile(dir + "/.checkpoint-0000000020.pt.tmp.job-b.node-1.4244.0123456789abcdef",
                     "another job's");
  testing::WriteFile(dir + "/checkpoint-0000000010.pt", "complete");
  EXPECT_EQ(Store(dir, "job-a.node-1").RemoveOwnTemporaries(), 1);
  EXPECT_THAT(Names(dir),
              UnorderedElementsAre(
                  ".checkpoint-0000000020.pt.tmp.job-a.node-2.4243.0123456789abcdef",
                  ".checkpoint-0000000020.pt.tmp.job-b.node-1.4244.0123456789abcdef",
                  "checkpoint-0000000010.pt"));
}

TEST(CheckpointStoreTest, AWriterNameIsMadeSafeForFileNames) {
  EXPECT_EQ(FileNameToken("job-a.node/../x y"), "job-a.node_.._x_y");
  EXPECT_EQ(FileNameToken(""), "_");
  const std::string dir = testing::MakeTempDir("store-name");
  ASSERT_THAT(Store(dir, "../escape").Write(1, {'x'}), ::ddp::testing::IsOk());
  EXPECT_THAT(Names(dir), ElementsAre("checkpoint-0000000001.pt"));
}

TEST(CheckpointStoreTest, AnUnreadableCheckpointIsUnavailableNotAbsent) {
  const std::string dir = testing::MakeTempDir("store-unreadable");
  // A directory where the file should be: listed, but reading fails (EISDIR), which no
  // resume may mistake for "no checkpoint yet".
  std::filesystem::create_directories(dir + "/checkpoint-0000000003.pt");
  CheckpointStore store = Store(dir, "w");
  DDP_ASSERT_OK_AND_ASSIGN(auto steps, store.Steps());
  EXPECT_THAT(steps, ElementsAre(3));
  EXPECT_THAT(store.Read(3), StatusIs(absl::StatusCode::kUnavailable,
                                      HasSubstr("checkpoint-0000000003.pt")));
}

TEST(CheckpointStoreTest, MarkersTellWritersApart) {
  const std::string dir = testing::MakeTempDir("store-markers");
  CheckpointStore store = Store(dir, "w");
  ASSERT_THAT(store.PutMarker(".writer.job.1.0"), ::ddp::testing::IsOk());
  ASSERT_THAT(store.PutMarker(".writer.job.1.2"), ::ddp::testing::IsOk());
  ASSERT_THAT(store.PutMarker(".writer.job.2.0"), ::ddp::testing::IsOk());
  EXPECT_THAT(store.Markers(".writer.job.1."),
              UnorderedElementsAre(".writer.job.1.0", ".writer.job.1.2"));
  store.RemoveMarker(".writer.job.1.0");
  EXPECT_THAT(store.Markers(".writer.job.1."), ElementsAre(".writer.job.1.2"));
}

CheckpointStore OfAttempt(const std::string& dir, const std::string& writer, int64_t attempt) {
  return CheckpointStore(CheckpointStore::Options{dir, writer, 2, -1, attempt});
}

TEST(CheckpointStoreTest, AStaleAttemptWritesNothingOnceANewerOneClaimedTheDirectory) {
  const std::string dir = testing::MakeTempDir("fence") + "/ckpt";
  CheckpointStore old_attempt = OfAttempt(dir, "job.w2", 1);
  ASSERT_THAT(old_attempt.Claim(), ::ddp::testing::IsOk());
  ASSERT_THAT(old_attempt.Write(10, {'a'}), ::ddp::testing::IsOk());
  // The coordinator gave up on attempt 1 (w2 cut off); attempt 2 starts elsewhere.
  CheckpointStore new_attempt = OfAttempt(dir, "job.w3", 2);
  ASSERT_THAT(new_attempt.Claim(), ::ddp::testing::IsOk());
  EXPECT_THAT(old_attempt.Write(20, {'b'}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("fenced: attempt 2 of this job now owns checkpoint directory")));
  EXPECT_THAT(old_attempt.Claim(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                            HasSubstr("this rank of attempt 1")));
  DDP_ASSERT_OK_AND_ASSIGN(auto steps, new_attempt.Steps());
  EXPECT_THAT(steps, ElementsAre(10)) << "the refused save left nothing behind";
  EXPECT_THAT(Names(dir), UnorderedElementsAre("checkpoint-0000000010.pt", ".fence"));
  ASSERT_THAT(new_attempt.Write(20, {'c'}), ::ddp::testing::IsOk());
  // Claims are idempotent and never lower the fence.
  ASSERT_THAT(new_attempt.Claim(), ::ddp::testing::IsOk());
  ASSERT_THAT(OfAttempt(dir, "job.w1", 3).Claim(), ::ddp::testing::IsOk());
  EXPECT_THAT(new_attempt.Write(30, {'d'}), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(testing::ReadFile(dir + "/.fence"), "3\n");
}

TEST(CheckpointStoreTest, AWriterWithoutAnAttemptIsNotFenced) {
  const std::string dir = testing::MakeTempDir("unfenced");
  ASSERT_THAT(OfAttempt(dir, "job.a", 5).Claim(), ::ddp::testing::IsOk());
  EXPECT_THAT(Store(dir, "job.b").Write(1, {'x'}), ::ddp::testing::IsOk());
}

TEST(CheckpointStoreTest, AFenceFileThatIsNoNumberIsAnErrorAndKeepsWhatIsThere) {
  const std::string dir = testing::MakeTempDir("badfence");
  CheckpointStore store = OfAttempt(dir, "job.a", 1);
  ASSERT_THAT(store.Write(1, {'x'}), ::ddp::testing::IsOk());
  testing::WriteFile(dir + "/.fence", "two\n");
  EXPECT_THAT(store.Write(2, {'y'}), StatusIs(absl::StatusCode::kUnavailable,
                                               HasSubstr("holds 'two', not an attempt number")));
  DDP_ASSERT_OK_AND_ASSIGN(auto steps, store.Steps());
  EXPECT_THAT(steps, ElementsAre(1));
}

}  // namespace
}  // namespace ddp
