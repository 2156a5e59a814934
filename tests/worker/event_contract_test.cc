// The trainer event contract: common/contract/events.h defines each event type once;
// the trainer's writer, the agent's parser, v1::TrainerEvent and docs/trainer.md must
// all agree with it, and a line that does not is reported, not silently accepted.
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "worker/agent/trainer_event_parser.h"
#include "common/contract/events.h"

namespace ddp {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// Gives every field a distinct value: integers 1, 2, ..., doubles n + 0.5, strings
// "s<n>", booleans true; optionals and arrays get one filled element.
class Filler {
 public:
  void operator()(const char*, int64_t& v, const char*) { v = ++n_; }
  void operator()(const char*, double& v, const char*) { v = ++n_ + 0.5; }
  void operator()(const char*, bool& v, const char*) { v = true; }
  void operator()(const char*, std::string& v, const char*) { v = absl::StrCat("s", ++n_); }
  void operator()(const char*, std::optional<double>& v, const char*) { v = ++n_ + 0.25; }
  template <typename S>
  void operator()(const char*, std::optional<S>& v, const char*) {
    v.emplace();
    S::Fields(*v, *this);
  }
  template <typename S>
  void operator()(const char*, std::vector<S>& v, const char*) {
    v.emplace_back();
    S::Fields(v.back(), *this);
  }

 private:
  int64_t n_ = 0;
};

// Checks that the body's field of each name holds the definition's value.
class ProtoChecker {
 public:
  explicit ProtoChecker(const google::protobuf::Message& e) : e_(e) {}
  void operator()(const char* name, const int64_t& v, const char*) {
    const auto* f = Field(name);
    if (f == nullptr) return;
    const int64_t got = f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_INT32
                            ? R()->GetInt32(e_, f)
                            : R()->GetInt64(e_, f);
    EXPECT_EQ(got, v) << name;
  }
  void operator()(const char* name, const double& v, const char*) {
    if (const auto* f = Field(name)) {
      EXPECT_EQ(R()->GetDouble(e_, f), v) << name;
    }
  }
  void operator()(const char* name, const bool& v, const char*) {
    if (const auto* f = Field(name)) {
      EXPECT_EQ(R()->GetBool(e_, f), v) << name;
    }
  }
  void operator()(const char* name, const std::string& v, const char*) {
    if (const auto* f = Field(name)) {
      EXPECT_EQ(R()->GetString(e_, f), v) << name;
    }
  }
  void operator()(const char* name, const std::optional<double>& v, const char*) {
    const auto* f = Field(name);
    if (f == nullptr) return;
    ASSERT_TRUE(R()->HasField(e_, f)) << name;
    EXPECT_EQ(R()->GetDouble(e_, f), *v) << name;
  }
  template <typename S>
  void operator()(const char*, const S&, const char*) {}  // Not relayed.

 private:
  const google::protobuf::Reflection* R() { return e_.GetReflection(); }
  const google::protobuf::FieldDescriptor* Field(const char* name) {
    return e_.GetDescriptor()->FindFieldByName(name);
  }
  const google::protobuf::Message& e_;
};

// The body of `e` for event type `type`, nullptr if the type has none.
const google::protobuf::Message* Body(const v1::TrainerEvent& e, const std::string& type) {
  const auto* f = v1::TrainerEvent::descriptor()->FindFieldByName(type);
  if (f == nullptr || f->containing_oneof() == nullptr) return nullptr;
  return &e.GetReflection()->GetMessage(e, f);
}

TEST(EventContractTest, EveryEventGoesFromTheTrainersWriterIntoTheProtoIntact) {
  int types = 0;
  ForEachEventType([&types](auto event) {
    using E = decltype(event);
    ++types;
    E::Fields(event, Filler());
    const std::string line = EventLine(event, /*rank=*/3, /*time=*/1700000000.25);
    v1::TrainerEvent parsed;
    std::vector<std::string> problems;
    ASSERT_TRUE(ParseTrainerEvent(line, &parsed, &problems)) << line;
    EXPECT_THAT(problems, IsEmpty()) << line;
    EXPECT_EQ(parsed.rank(), 3);
    EXPECT_EQ(parsed.time(), 1700000000.25);
    const google::protobuf::Message* body = Body(parsed, E::kType);
    if (std::string(E::kType) == "buckets" || std::string(E::kType) == "trace") {
      EXPECT_EQ(body, nullptr) << E::kType << " stays in the trainer's stream";
      EXPECT_EQ(parsed.body_case(), v1::TrainerEvent::BODY_NOT_SET);
      EXPECT_EQ(EventTypeName(parsed), "");
      return;
    }
    ASSERT_NE(body, nullptr) << E::kType;
    EXPECT_EQ(EventTypeName(parsed), E::kType);
    E::Fields(event, ProtoChecker(*body));
  });
  EXPECT_EQ(types, 9);
}

TEST(EventContractTest, EachRelayedTypeFillsItsOwnTypedBody) {
  StepEvent step;
  step.global_step = 42;
  step.loss = 0.125;
  v1::TrainerEvent parsed;
  ASSERT_TRUE(ParseTrainerEvent(EventLine(step, 1, 2.0), &parsed));
  ASSERT_EQ(parsed.body_case(), v1::TrainerEvent::kStep);
  EXPECT_EQ(parsed.step().global_step(), 42);
  EXPECT_EQ(parsed.step().loss(), 0.125);
  ErrorEvent error;
  error.message = "boom";
  error.node_fault = true;
  ASSERT_TRUE(ParseTrainerEvent(EventLine(error, 1, 2.0), &parsed));
  ASSERT_EQ(parsed.body_case(), v1::TrainerEvent::kError) << "the previous body is cleared";
  EXPECT_EQ(parsed.error().message(), "boom");
  EXPECT_TRUE(parsed.error().node_fault());
  EXPECT_FALSE(parsed.error().retryable());
}

TEST(EventContractTest, EveryProtoFieldIsDefinedByAnEventTypeWithACompatibleType) {
  EXPECT_THAT(TrainerEventProtoMismatches(), IsEmpty());
}

TEST(EventContractTest, UnknownMissingAndMistypedFieldsAreReported) {
  StepEvent step;
  std::string line = EventLine(step, 0, 1.0);
  // An extra field, "loss" gone, "steps" a string.
  line.replace(line.find("\"loss\":0,"), 9, "\"extra\":[1],");
  line.replace(line.find("\"steps\":0"), 9, "\"steps\":\"many\"");
  v1::TrainerEvent parsed;
  std::vector<std::string> problems;
  ASSERT_TRUE(ParseTrainerEvent(line, &parsed, &problems)) << line;
  EXPECT_THAT(problems, UnorderedElementsAre("step: missing field 'loss'",
                                             "step: field 'steps' is not an integer",
                                             "step: unknown field 'extra'"));
  EXPECT_EQ(parsed.body_case(), v1::TrainerEvent::kStep) << "what could be read is still relayed";

  problems.clear();
  ASSERT_TRUE(ParseTrainerEvent(R"({"type":"stall","rank":1,"time":2})", &parsed, &problems));
  EXPECT_THAT(problems, ElementsAre("unknown event type 'stall'"));
  EXPECT_EQ(parsed.body_case(), v1::TrainerEvent::BODY_NOT_SET) << "nothing to relay";
  problems.clear();
  StartEvent start;
  start.resumed_from.emplace();
  line = EventLine(start, 0, 1.0);
  line.replace(line.find("\"global_step\":0"), 15, "\"globalstep\":0");
  ASSERT_TRUE(ParseTrainerEvent(line, &parsed, &problems));
  EXPECT_THAT(problems, UnorderedElementsAre("start.resumed_from: missing field 'global_step'",
                                             "start.resumed_from: unknown field 'globalstep'"));
}

TEST(EventContractTest, NullMeansAbsentForOptionalsAndNotANumberForDoubles) {
  EpochEvent epoch;  // No validation: val_loss and val_accuracy are null.
  StepEvent step;
  step.loss = std::nan("");  // A diverged run.
  v1::TrainerEvent parsed;
  std::vector<std::string> problems;
  ASSERT_TRUE(ParseTrainerEvent(EventLine(epoch, 0, 1.0), &parsed, &problems));
  ASSERT_TRUE(parsed.has_epoch());
  EXPECT_FALSE(parsed.epoch().has_val_loss());
  EXPECT_FALSE(parsed.epoch().has_val_accuracy());
  ASSERT_TRUE(ParseTrainerEvent(EventLine(step, 0, 1.0), &parsed, &problems));
  ASSERT_TRUE(parsed.has_step());
  EXPECT_TRUE(std::isnan(parsed.step().loss()));
  EXPECT_THAT(problems, IsEmpty());
}

TEST(EventContractTest, PlainOutputIsNotAnEvent) {
  v1::TrainerEvent parsed;
  EXPECT_FALSE(ParseTrainerEvent("Traceback (most recent call last):", &parsed));
  EXPECT_FALSE(ParseTrainerEvent("{not json", &parsed));
  EXPECT_FALSE(ParseTrainerEvent(R"({"no_type":1})", &parsed));
}

TEST(EventContractTest, TheDocsEventsTableIsGeneratedFromTheDefinitions) {
  std::ifstream in(std::string(DDP_SOURCE_DIR) + "/docs/trainer.md");
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  const std::string begin = "<!-- events table: generated by EventsMarkdownTable() -->\n";
  const std::string end = "<!-- end of events table -->";
  const size_t b = doc.find(begin), e = doc.find(end);
  ASSERT_NE(b, std::string::npos) << "docs/trainer.md lost its events table marker";
  ASSERT_NE(e, std::string::npos);
  EXPECT_EQ(doc.substr(b + begin.size(), e - b - begin.size()), EventsMarkdownTable())
      << "docs/trainer.md's events table differs from common/contract/events.h; paste "
         "this between the markers:\n"
      << EventsMarkdownTable();
}

}  // namespace
}  // namespace ddp
