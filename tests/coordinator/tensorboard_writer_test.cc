// The coordinator's live TensorBoard files (--tensorboard-dir): what the hub hands the
// writer lands in each job's run as TFRecords of Events, appended in order; attempt
// and recovery texts once each, and only of what ended after the writer started; a
// full queue drops and counts; bad directories are refused by name. The records are
// read back here with protobuf's own parser; tensorboard_export_test reads a real
// job's live run with TensorBoard's reader.
#include "coordinator/tracking/tensorboard_writer.h"

#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/tensorboard/event_file.h"
#include "gmock/gmock.h"
#include "google/protobuf/unknown_field_set.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace ddp {
namespace {

using google::protobuf::UnknownFieldSet;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

// One event as read back: its step and either a scalar (tag, value), a text (tag,
// text) or the file version.
struct Event {
  int64_t step = 0;
  std::string file_version, tag, text;
  float value = 0;
};

const google::protobuf::UnknownField* Find(const UnknownFieldSet& set, int number) {
  for (int i = 0; i < set.field_count(); ++i) {
    if (set.field(i).number() == number) return &set.field(i);
  }
  return nullptr;
}

// Every record of the file, its framing and both CRCs checked.
std::vector<Event> ReadEvents(const std::string& path) {
  const std::string bytes = testing::ReadFile(path);
  std::vector<Event> events;
  size_t off = 0;
  while (off < bytes.size()) {
    EXPECT_GE(bytes.size() - off, 16u) << "a cut record at " << off;
    if (bytes.size() - off < 16) break;
    uint64_t len;
    std::memcpy(&len, bytes.data() + off, 8);
    uint32_t len_crc, data_crc;
    std::memcpy(&len_crc, bytes.data() + off + 8, 4);
    EXPECT_EQ(len_crc, tensorboard::MaskedCrc32c(bytes.substr(off, 8)));
    const std::string data = bytes.substr(off + 12, len);
    std::memcpy(&data_crc, bytes.data() + off + 12 + len, 4);
    EXPECT_EQ(data_crc, tensorboard::MaskedCrc32c(data));
    off += 16 + len;

    UnknownFieldSet event;
    EXPECT_TRUE(event.ParseFromString(data));
    Event e;
    if (auto* f = Find(event, 2)) e.step = static_cast<int64_t>(f->varint());
    if (auto* f = Find(event, 3)) e.file_version = f->length_delimited();
    if (auto* f = Find(event, 5)) {
      UnknownFieldSet summary, value;
      EXPECT_TRUE(summary.ParseFromString(f->length_delimited()));
      EXPECT_TRUE(value.ParseFromString(Find(summary, 1)->length_delimited()));
      e.tag = Find(value, 1)->length_delimited();
      if (auto* v = Find(value, 2)) {
        const uint32_t bits = v->fixed32();
        std::memcpy(&e.value, &bits, 4);
      }
      if (auto* tensor = Find(value, 8)) {
        UnknownFieldSet t;
        EXPECT_TRUE(t.ParseFromString(tensor->length_delimited()));
        e.text = Find(t, 8)->length_delimited();
      }
    }
    events.push_back(e);
  }
  return events;
}

// (tag, step) of each scalar, in file order.
std::vector<std::pair<std::string, int64_t>> Scalars(const std::vector<Event>& events) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const Event& e : events) {
    if (!e.tag.empty() && e.text.empty()) out.emplace_back(e.tag, e.step);
  }
  return out;
}
std::vector<std::string> Texts(const std::vector<Event>& events) {
  std::vector<std::string> out;
  for (const Event& e : events) {
    if (!e.text.empty()) out.push_back(e.text);
  }
  return out;
}

v1::RankMetrics Step(int rank, int64_t global_step, double loss) {
  v1::RankMetrics m;
  m.set_rank(rank);
  m.set_attempt(1);
  m.set_global_step(global_step);
  m.set_loss(loss);
  m.set_samples_per_s(100 + rank);
  m.set_step_ms(5);
  m.set_comm_ms(1);
  m.set_update_ms(1'700'000'000'000 + global_step);
  return m;
}

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

class TensorBoardWriterTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("tensorboard_writer"); }
  void TearDown() override { testing::RemoveTree(dir_); }

  std::unique_ptr<TensorBoardWriter> Start(TensorBoardWriter::Options options = {}) {
    options.dir = dir_ + "/runs";
    options.file_suffix = "test";
    auto writer = TensorBoardWriter::Start(options, [this](const std::string& id)
                                               -> absl::StatusOr<v1::Job> {
      if (gate_ != nullptr) gate_->WaitForNotification();
      auto it = jobs_.find(id);
      if (it == jobs_.end()) return absl::NotFoundError(id);
      return it->second;
    });
    EXPECT_TRUE(writer.ok()) << writer.status();
    return writer.ok() ? *std::move(writer) : nullptr;
  }
  std::string RunFile(const std::string& job) {
    return dir_ + "/runs/" + job + "/events.out.tfevents.test";
  }

  std::string dir_;
  std::map<std::string, v1::Job> jobs_;         // What the lookup answers.
  absl::Notification* gate_ = nullptr;          // Holds the lookup while set.
};

TEST_F(TensorBoardWriterTest, StoredPointsAreAppendedToTheJobsRunInOrder) {
  auto writer = Start();
  v1::EpochSummary epoch;
  epoch.set_epoch(0);
  epoch.set_train_loss(0.5);
  epoch.set_val_loss(std::nan(""));  // No validation: no val tags.
  epoch.set_val_accuracy(std::nan(""));
  writer->Stored({{"a-1", {Step(0, 1, 0.9), Step(1, 1, 0.8)}, {}, {}},
                  {"b-2", {Step(0, 7, 0.1)}, {}, {}},
                  {"c-3", {}, {}, {v1::LogLine()}}});  // Output lines only: no run.
  writer->Stored({{"a-1", {Step(0, 2, 0.7)}, {epoch}, {}}});
  writer->Flush();

  const std::vector<Event> a = ReadEvents(RunFile("a-1"));
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a[0].file_version, "brain.Event:2");
  EXPECT_THAT(Scalars(a),
              ElementsAre(Pair("loss/rank0", 1), Pair("samples_per_s/rank0", 1),
                          Pair("step_time_ms/rank0", 1), Pair("comm_time_ms/rank0", 1),
                          Pair("loss/rank1", 1), Pair("samples_per_s/rank1", 1),
                          Pair("step_time_ms/rank1", 1), Pair("comm_time_ms/rank1", 1),
                          Pair("loss/rank0", 2), Pair("samples_per_s/rank0", 2),
                          Pair("step_time_ms/rank0", 2), Pair("comm_time_ms/rank0", 2),
                          Pair("epoch/train_loss", 0)));
  EXPECT_EQ(a[1].value, 0.9f);
  EXPECT_EQ(a[9].value, 0.7f);
  EXPECT_EQ(a[13].value, 0.5f);
  EXPECT_EQ(Scalars(ReadEvents(RunFile("b-2"))).size(), 4u);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/runs/c-3"));
  EXPECT_EQ(writer->stats().events, 1 + 13 + 1 + 4);  // With each file's version.
  EXPECT_EQ(writer->stats().open_files, 2u);
}

TEST_F(TensorBoardWriterTest, AttemptsAndRecoveriesAreWrittenOnceWhenTheyEnd) {
  const int64_t before_start = NowMs() - 60'000;
  v1::Job job;
  job.set_id("j-1");
  job.set_state(v1::RUNNING);
  v1::Attempt* old = job.add_attempts();  // Ended before this coordinator led.
  old->set_number(1);
  old->set_state(v1::FAILED);
  old->set_start_ms(before_start - 1000);
  old->set_end_ms(before_start);
  v1::Attempt* second = job.add_attempts();
  second->set_number(2);
  second->set_state(v1::RUNNING);
  second->set_world_size(2);
  jobs_["j-1"] = job;
  auto writer = Start();

  writer->Changed("j-1");  // Attempt 2 runs; attempt 1 ended before: nothing to write.
  writer->Flush();
  EXPECT_FALSE(std::filesystem::exists(RunFile("j-1")));

  v1::Recovery* r = jobs_["j-1"].mutable_attempts(1)->add_recoveries();
  r->set_generation(1);
  r->add_ranks(1);
  r->set_cause("rank 1 exited 1");
  r->set_start_ms(NowMs());
  r->set_end_ms(NowMs());
  r->set_outcome("recovered");
  r->set_source_rank(0);
  r->set_global_step(40);
  writer->Changed("j-1");
  writer->Changed("j-1");  // Twice: written once.
  writer->Flush();
  EXPECT_THAT(Texts(ReadEvents(RunFile("j-1"))),
              ElementsAre(HasSubstr("attempt 2 recovery 1: ranks 1 replaced after rank 1 "
                                    "exited 1; recovered from rank 0's state at global step 40")));

  v1::Attempt* done = jobs_["j-1"].mutable_attempts(1);
  done->set_state(v1::SUCCEEDED);
  done->set_start_ms(NowMs() - 2000);
  done->set_end_ms(NowMs());
  jobs_["j-1"].set_state(v1::SUCCEEDED);
  writer->Changed("j-1");
  writer->Flush();
  EXPECT_EQ(writer->stats().open_files, 0u) << "a finished job's file is closed";
  writer->Changed("j-1");  // A finished job changes no more: nothing is repeated.
  writer->Flush();
  const std::vector<Event> events = ReadEvents(RunFile("j-1"));
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  const std::vector<std::string> texts = Texts(events);
  ASSERT_EQ(texts.size(), 2u);
  EXPECT_THAT(texts[1], HasSubstr("attempt 2: SUCCEEDED, world size 2"));
  EXPECT_THAT(texts[1], HasSubstr("restart 1 of job j-1"));
  EXPECT_EQ(events.back().step, 2) << "an attempt's text stands at its number";

  // Output that arrives after the end opens the file again and appends to it.
  writer->Stored({{"j-1", {Step(0, 50, 0.2)}, {}, {}}});
  writer->Flush();
  const std::vector<Event> later = ReadEvents(RunFile("j-1"));
  EXPECT_EQ(later.size(), events.size() + 4);
  EXPECT_EQ(std::count_if(later.begin(), later.end(),
                          [](const Event& e) { return !e.file_version.empty(); }),
            1);
}

TEST_F(TensorBoardWriterTest, FilesBeyondTheOpenLimitAreClosedAndAppendedToLater) {
  auto writer = Start({.max_open_files = 1});
  for (int step = 1; step <= 3; ++step) {
    writer->Stored({{"a-1", {Step(0, step, 0.5)}, {}, {}}});
    writer->Stored({{"b-2", {Step(0, step, 0.5)}, {}, {}}});
  }
  writer->Flush();
  EXPECT_EQ(writer->stats().open_files, 1u);
  for (const std::string job : {"a-1", "b-2"}) {
    const std::vector<Event> events = ReadEvents(RunFile(job));
    EXPECT_EQ(Scalars(events).size(), 12u) << job;
    EXPECT_EQ(events[0].file_version, "brain.Event:2") << job;
    EXPECT_EQ(std::count_if(events.begin(), events.end(),
                            [](const Event& e) { return !e.file_version.empty(); }),
              1)
        << job << ": one version event however often the file was opened";
  }
}

TEST_F(TensorBoardWriterTest, AFullQueueDropsAndCountsNewPointsWithoutBlocking) {
  absl::Notification gate;
  gate_ = &gate;
  jobs_["j-1"].set_id("j-1");
  auto writer = Start({.max_queued = 3});
  writer->Changed("j-1");  // The writer's thread waits in the lookup.
  writer->Stored({{"a-1", {Step(0, 1, 0.5), Step(1, 1, 0.5)}, {}, {}}});  // 2 queued.
  writer->Stored({{"a-1", {Step(0, 2, 0.5), Step(1, 2, 0.5)}, {}, {}}});  // 4 > 3: dropped.
  writer->Stored({{"a-1", {Step(0, 3, 0.5)}, {}, {}}});                   // 3: queued.
  EXPECT_EQ(writer->stats().dropped, 2);
  gate.Notify();
  writer->Flush();
  std::vector<int64_t> steps;
  for (const auto& [tag, step] : Scalars(ReadEvents(RunFile("a-1")))) {
    if (tag == "loss/rank0") steps.push_back(step);
  }
  EXPECT_THAT(steps, ElementsAre(1, 3));
}

TEST_F(TensorBoardWriterTest, ADirectoryItCannotWriteIsRefusedByName) {
  testing::WriteFile(dir_ + "/a-file", "x");
  absl::Status under_file = TensorBoardWriter::CheckDirectory(dir_ + "/a-file/runs");
  EXPECT_EQ(under_file.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(under_file.message(), HasSubstr("--tensorboard-dir " + dir_ + "/a-file/runs"));
  EXPECT_THAT(TensorBoardWriter::CheckDirectory("").message(), HasSubstr("must not be empty"));
  if (::geteuid() != 0) {  // root writes anywhere.
    ASSERT_EQ(::mkdir((dir_ + "/ro").c_str(), 0555), 0);
    EXPECT_THAT(TensorBoardWriter::CheckDirectory(dir_ + "/ro").message(),
                HasSubstr("cannot write there"));
  }
  EXPECT_TRUE(TensorBoardWriter::CheckDirectory(dir_ + "/new/nested").ok());
  EXPECT_TRUE(std::filesystem::is_directory(dir_ + "/new/nested"));
  EXPECT_EQ(testing::ReadFile(dir_ + "/a-file"), "x") << "left as it was";
}

}  // namespace
}  // namespace ddp
