// The agent's JSON reader for event lines (worker/agent/event_json.h): what protobuf's
// parser made of a valid line it makes too, and hostile lines (deep nesting, huge
// numbers, broken escapes) are refused with where and why, in time linear in their
// length.
#include "worker/agent/event_json.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "worker/agent/trainer_event_parser.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::HasSubstr;
using google::protobuf::Struct;

// The line of the report: a step with a field holding `depth` nested arrays.
std::string NestedLine(int depth) {
  return absl::StrCat(R"({"type":"step","loss":0.5,"x":)", std::string(depth, '['),
                      std::string(depth, ']'), "}");
}

TEST(EventJsonTest, ValidLinesReadAsProtobufsOwnParserReadsThem) {
  const char* lines[] = {
      R"({"type":"step","rank":0,"time":1.5e9,"epoch":3,"step":17,"loss":0.012345678901234567})",
      R"({"type":"epoch","val_loss":null,"val_accuracy":97.5,"ok":true,"no":false})",
      R"(  { "a" : [ 1 , -2.5e-3 , "x" , [ ] , { } , null ] , "b" : { "c" : { "d" : [0] } } } )",
      R"({"s":"tab\there \"quoted\" back\\slash \/ \u00e9 \u20ac \ud83d\ude00 \b\f\n\r"})",
      R"({"utf8":"déjà vu – ✓","empty":"","big":-1.7976931348623157e308,"tiny":5e-324})",
      R"({"zero":0,"neg_zero":-0,"int":9007199254740993,"e":1E+2})",
  };
  for (const char* line : lines) {
    Struct ours, theirs;
    ASSERT_TRUE(ParseJsonObject(line, &ours).ok()) << line;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(line, &theirs).ok()) << line;
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(ours, theirs))
        << line << "\nours: " << ours.DebugString() << "\ntheirs: " << theirs.DebugString();
  }
}

TEST(EventJsonTest, AKeyGivenTwiceKeepsItsLastValue) {
  Struct s;
  ASSERT_TRUE(ParseJsonObject(R"({"loss":1,"loss":2})", &s).ok());
  EXPECT_EQ(s.fields().at("loss").number_value(), 2);
}

TEST(EventJsonTest, ALoneSurrogateBecomesTheReplacementCharacter) {
  Struct s;
  ASSERT_TRUE(ParseJsonObject(R"({"a":"x\ud800y","b":"\udc00"})", &s).ok());
  EXPECT_EQ(s.fields().at("a").string_value(), "x\xEF\xBF\xBDy");
  EXPECT_EQ(s.fields().at("b").string_value(), "\xEF\xBF\xBD");
}

TEST(EventJsonTest, BrokenTextIsRefusedNamingWhatAndWhere) {
  struct Case {
    const char* text;
    const char* why;
  } cases[] = {
      {"", "expected a JSON object at byte 0"},
      {"[1]", "expected a JSON object at byte 0"},
      {R"({"a":1} x)", "unexpected text after the object at byte 8"},
      {R"({"a":1,})", "expected a quoted key at byte 7"},
      {R"({"a" 1})", "expected ':' at byte 5"},
      {R"({"a":[1 2]})", "expected ',' or ']' at byte 8"},
      {R"({"a":1 "b":2})", "expected ',' or '}' at byte 7"},
      {R"({"a":"x)", "unterminated string at byte 7"},
      {"{\"a\":\"x\ty\"}", "a control character in a string (escape it) at byte 7"},
      {R"({"a":"\q"})", "an unknown escape in a string at byte 7"},
      {R"({"a":"\u12"})", "a \\u escape needs four hex digits at byte 8"},
      {R"({"a":01})", "expected ',' or '}' at byte 6"},
      {R"({"a":1.})", "expected a digit after '.' at byte 7"},
      {R"({"a":1e})", "expected a digit in the exponent at byte 7"},
      {R"({"a":-})", "expected a value at byte 5"},
      {R"({"a":NaN})", "expected a value at byte 5"},
      {R"({"a":Infinity})", "expected a value at byte 5"},
      {R"({"a":tru})", "expected a value at byte 5"},
      {R"({"a":1e999})", "number out of range at byte 5"},
      {R"({"a":)", "unexpected end of text at byte 5"},
  };
  for (const Case& c : cases) {
    Struct s;
    EXPECT_THAT(ParseJsonObject(c.text, &s),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.why)))
        << c.text;
  }
}

TEST(EventJsonTest, NestingIsBoundedAtTheLimit) {
  Struct s;
  // The object itself is level 1; 31 arrays inside it make 32.
  EXPECT_TRUE(ParseJsonObject(NestedLine(kMaxEventJsonDepth - 1), &s).ok());
  EXPECT_THAT(ParseJsonObject(NestedLine(kMaxEventJsonDepth), &s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("nested deeper than 32 levels at byte")));
  std::string objects = "{";
  for (int i = 0; i < 40; ++i) absl::StrAppend(&objects, R"("k":{)");
  objects += std::string(41, '}');
  EXPECT_THAT(ParseJsonObject(objects, &s),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nested deeper")));
}

// The report's line: 60 KB of nesting in one step line. protobuf's parser spent minutes
// on it (and then accepted it) while the rank's output, its exit and cancel waited.
TEST(EventJsonTest, TheHostileNestedLineIsAMalformedProgramLine) {
  const std::string line = NestedLine(30'000);
  ASSERT_GT(line.size(), 60'000u);
  ASSERT_LT(line.size(), 64u << 10) << "under the event line limit, so it reaches the parser";
  v1::TrainerEvent event;
  std::string why;
  EXPECT_EQ(ParseProgramEvent(line, /*rank=*/0, /*now=*/1.0, &event, &why),
            ProgramLine::kMalformed);
  EXPECT_THAT(why, HasSubstr("not valid JSON: nested deeper than 32 levels"));
  // ddp-trainer's own stream: not an event, so relayed as (cut) output.
  EXPECT_FALSE(ParseTrainerEvent(line, &event));
}

TEST(EventJsonTest, AFlatLineOfSixtyKilobytesIsReadWhole) {
  std::string line = R"({"type":"step","loss":0.5,"x":[)";
  while (line.size() < 60'000) line += "0.125,";
  line += "1]}";
  v1::TrainerEvent event;
  std::string why;
  ASSERT_EQ(ParseProgramEvent(line, /*rank=*/0, /*now=*/1.0, &event, &why), ProgramLine::kEvent)
      << why;
  EXPECT_DOUBLE_EQ(event.step().loss(), 0.5);
}

}  // namespace
}  // namespace ddp
