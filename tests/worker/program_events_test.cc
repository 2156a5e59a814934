// Event lines from users' programs (command jobs): read leniently, so that a program
// reporting only a loss is shown live, and garbage on the descriptor is counted and
// shown once, never fatal.
#include <unistd.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/agent/event_buffer.h"
#include "worker/agent/output_pump.h"
#include "worker/agent/trainer_event_parser.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

ProgramLine Parse(const std::string& line, v1::TrainerEvent* e, std::string* why = nullptr) {
  std::string ignored;
  return ParseProgramEvent(line, /*rank=*/1, /*now=*/1234.5, e, why ? why : &ignored);
}

TEST(ProgramEventTest, AStepNeedsOnlyItsTypeAndLoss) {
  v1::TrainerEvent e;
  ASSERT_EQ(Parse(R"({"type": "step", "loss": 0.25})", &e), ProgramLine::kEvent);
  ASSERT_EQ(e.body_case(), v1::TrainerEvent::kStep);
  EXPECT_DOUBLE_EQ(e.step().loss(), 0.25);
  EXPECT_EQ(e.rank(), 1);              // The worker's, not the line's.
  EXPECT_DOUBLE_EQ(e.time(), 1234.5);  // Now, when the line has none.
  EXPECT_EQ(e.step().epoch(), 0);
}

TEST(ProgramEventTest, OptionalFieldsAreReadAndUnknownOnesIgnored) {
  v1::TrainerEvent e;
  ASSERT_EQ(Parse(R"({"type":"step","loss":1.5,"epoch":2,"step":7,"steps":28,)"
                  R"("samples_per_s":812.5,"step_ms":9.75,"comm_ms":1.25,"time":99.0,)"
                  R"("rank":7,"my_metric":"x","grad_norm":3})",
                  &e),
            ProgramLine::kEvent);
  ASSERT_TRUE(e.has_step());
  EXPECT_EQ(e.step().epoch(), 2);
  EXPECT_EQ(e.step().step(), 7);
  EXPECT_EQ(e.step().steps(), 28);
  EXPECT_DOUBLE_EQ(e.step().samples_per_s(), 812.5);
  EXPECT_DOUBLE_EQ(e.step().step_ms(), 9.75);
  EXPECT_DOUBLE_EQ(e.step().comm_ms(), 1.25);
  EXPECT_FALSE(e.step().has_compute_ms()) << "phases the program did not give stay unset";
  EXPECT_DOUBLE_EQ(e.time(), 99.0);
  EXPECT_EQ(e.rank(), 1) << "a program cannot report for another rank";
}

TEST(ProgramEventTest, AStepsPhasesAreRead) {
  v1::TrainerEvent e;
  ASSERT_EQ(Parse(R"({"type":"step","loss":1.5,"step_ms":10,"comm_ms":2,"data_ms":3.5,)"
                  R"("compute_ms":4,"optimizer_ms":0.5})",
                  &e),
            ProgramLine::kEvent);
  ASSERT_TRUE(e.step().has_data_ms());
  EXPECT_DOUBLE_EQ(e.step().data_ms(), 3.5);
  EXPECT_DOUBLE_EQ(e.step().compute_ms(), 4);
  EXPECT_DOUBLE_EQ(e.step().optimizer_ms(), 0.5);
}

TEST(ProgramEventTest, EpochAndCheckpointLinesAreOptionalToo) {
  v1::TrainerEvent e;
  ASSERT_EQ(Parse(R"({"type":"epoch","epoch":3,"train_loss":0.5,"val_accuracy":0.97})", &e),
            ProgramLine::kEvent);
  ASSERT_TRUE(e.has_epoch());
  EXPECT_DOUBLE_EQ(e.epoch().train_loss(), 0.5);
  EXPECT_FALSE(e.epoch().has_val_loss());
  EXPECT_DOUBLE_EQ(e.epoch().val_accuracy(), 0.97);
  ASSERT_EQ(Parse(R"({"type":"checkpoint","path":"ckpt/e3.pt","epoch":3})", &e),
            ProgramLine::kEvent);
  ASSERT_TRUE(e.has_checkpoint());
  EXPECT_EQ(e.checkpoint().path(), "ckpt/e3.pt");
}

TEST(ProgramEventTest, MalformedLinesSayWhy) {
  v1::TrainerEvent e;
  std::string why;
  EXPECT_EQ(Parse("hello", &e, &why), ProgramLine::kMalformed);
  EXPECT_EQ(why, "not a JSON object");
  EXPECT_EQ(Parse("{\"type\": \"step\", \"loss\": ", &e, &why), ProgramLine::kMalformed);
  EXPECT_EQ(why, "not valid JSON: unexpected end of text at byte 25");
  EXPECT_EQ(Parse(R"({"loss": 1})", &e, &why), ProgramLine::kMalformed);
  EXPECT_THAT(why, HasSubstr("no \"type\""));
  EXPECT_EQ(Parse(R"({"type": "stepp", "loss": 1})", &e, &why), ProgramLine::kMalformed);
  EXPECT_THAT(why, HasSubstr("unknown type 'stepp'"));
  EXPECT_EQ(Parse(R"({"type": "step", "epoch": 1})", &e, &why), ProgramLine::kMalformed);
  EXPECT_THAT(why, HasSubstr("needs \"loss\""));
  EXPECT_EQ(Parse(R"({"type": "step", "loss": "low"})", &e, &why), ProgramLine::kMalformed);
  EXPECT_THAT(why, HasSubstr("field 'loss' is not a number"));
  EXPECT_EQ(Parse(R"({"type": "step", "loss": 1, "epoch": 1.5})", &e, &why),
            ProgramLine::kMalformed);
  EXPECT_THAT(why, HasSubstr("field 'epoch' is not an integer"));
}

TEST(ProgramEventTest, OnlyTheTypesAProgramMaySendAreRead) {
  v1::TrainerEvent e;
  std::string why;
  // `start` describes ddp-trainer's own set-up: not a program's to claim.
  EXPECT_EQ(Parse(R"({"type": "start", "world_size": 64})", &e, &why), ProgramLine::kMalformed);
  EXPECT_THAT(why, HasSubstr("unknown type 'start'"));
  // A program's error explains a failure worth a restart unless it says otherwise.
  ASSERT_EQ(Parse(R"({"type": "error", "message": "out of memory"})", &e), ProgramLine::kEvent);
  ASSERT_TRUE(e.has_error());
  EXPECT_EQ(e.error().message(), "out of memory");
  EXPECT_TRUE(e.error().retryable());
  ASSERT_EQ(Parse(R"({"type": "error", "message": "bad config", "retryable": false})", &e),
            ProgramLine::kEvent);
  EXPECT_FALSE(e.error().retryable());
  // Numbers an int64 cannot hold are refused, not converted.
  EXPECT_EQ(Parse(R"({"type": "step", "loss": 1, "epoch": 1e300})", &e, &why),
            ProgramLine::kMalformed);
  EXPECT_THAT(why, HasSubstr("field 'epoch' is not an integer"));
}

TEST(ProgramEventTest, VerboseTypesStayLocal) {
  v1::TrainerEvent e;
  EXPECT_EQ(Parse(R"({"type": "trace", "entries": []})", &e), ProgramLine::kDropped);
}

// Reads every entry the pump pushes until the source is drained.
std::vector<v1::ReportedEvent> Pump(const std::string& event_bytes, EventCheck check) {
  EventBuffer buffer;
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  {
    OutputPump pump(&buffer, RealClock());
    const OutputSource source{"job-1", 1, 0};
    pump.Add(source, fds[0], -1, -1, check);
    EXPECT_EQ(::write(fds[1], event_bytes.data(), event_bytes.size()),
              static_cast<ssize_t>(event_bytes.size()));
    ::close(fds[1]);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!pump.Drained(source) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
    EXPECT_TRUE(pump.Drained(source));
    if (check == EventCheck::kLenient) {
      EXPECT_EQ(pump.malformed_event_lines(), 3);
    }
  }
  int64_t dropped = 0;
  return buffer.Take(1000, 1 << 20, &dropped);
}

TEST(ProgramEventTest, GarbageOnTheDescriptorIsShownOnceThenCounted) {
  const auto out = Pump("not json\n{\"type\":\"step\",\"loss\":0.5}\n{broken\n\x01\x02\n",
                        EventCheck::kLenient);
  ASSERT_EQ(out.size(), 3u);
  ASSERT_TRUE(out[0].has_log());
  EXPECT_EQ(out[0].log().stream(), "stderr");
  EXPECT_THAT(out[0].log().text(),
              HasSubstr("a line on DDP_EVENTS_FD is not an event (not a JSON object"));
  EXPECT_THAT(out[0].log().text(), HasSubstr("not json"));
  ASSERT_TRUE(out[1].has_event()) << "the good line between is relayed";
  EXPECT_DOUBLE_EQ(out[1].event().step().loss(), 0.5);
  ASSERT_TRUE(out[2].has_log());
  EXPECT_THAT(out[2].log().text(), HasSubstr("3 lines on DDP_EVENTS_FD in all were not events"));
}

TEST(ProgramEventTest, ADeeplyNestedLineIsCountedAndTheNextLineStillRelayed) {
  // The report's 60 KB line: 30,000 nested arrays in a step's extra field. It once held
  // the pump (and so every rank's output, exits and cancel) for minutes.
  const std::string hostile = absl::StrCat(R"({"type":"step","loss":0.5,"x":)",
                                           std::string(30'000, '['), std::string(30'000, ']'),
                                           "}");
  EventBuffer buffer;
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  OutputPump pump(&buffer, RealClock());
  const OutputSource source{"job-1", 1, 0};
  pump.Add(source, fds[0], -1, -1, EventCheck::kLenient);
  const std::string bytes = hostile + "\n{\"type\":\"step\",\"loss\":0.25}\n";
  std::thread writer([&] {
    EXPECT_EQ(::write(fds[1], bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    ::close(fds[1]);
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!pump.Drained(source) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  writer.join();
  ASSERT_TRUE(pump.Drained(source)) << "the pump is still reading the nested line";
  EXPECT_EQ(pump.malformed_event_lines(), 1);
  int64_t dropped = 0;
  const auto out = buffer.Take(1000, 1 << 20, &dropped);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_THAT(out[0].log().text(), HasSubstr("nested deeper than 32 levels"));
  ASSERT_TRUE(out[1].has_event());
  EXPECT_DOUBLE_EQ(out[1].event().step().loss(), 0.25);
}

TEST(ProgramEventTest, TheTrainersStreamStaysStrict) {
  // The built-in trainer's non-event lines are output, as before: no counting.
  const auto out = Pump("plain text\n", EventCheck::kStrict);
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(out[0].has_log());
  EXPECT_EQ(out[0].log().text(), "plain text");
}

}  // namespace
}  // namespace ddp
