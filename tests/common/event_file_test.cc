// TensorBoard event files: the CRC, the record framing and the Event encoding, checked
// field by field with protobuf's own parser (an UnknownFieldSet: the wire format as
// any reader of tensorboard.Event sees it). tensorboard_export_test reads whole files
// with TensorBoard itself.
#include "common/tensorboard/event_file.h"

#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/unknown_field_set.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace ddp::tensorboard {
namespace {

using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

using Fields = std::unique_ptr<UnknownFieldSet>;

Fields Parse(const std::string& bytes) {
  auto set = std::make_unique<UnknownFieldSet>();
  EXPECT_TRUE(set->ParseFromString(bytes));
  return set;
}

// The one field numbered `number` (and fails the test if there is not exactly one).
const UnknownField& Field(const UnknownFieldSet& set, int number) {
  const UnknownField* found = nullptr;
  int count = 0;
  for (int i = 0; i < set.field_count(); ++i) {
    if (set.field(i).number() == number) {
      found = &set.field(i);
      ++count;
    }
  }
  EXPECT_EQ(count, 1) << "field " << number;
  if (found != nullptr) return *found;
  static UnknownFieldSet* missing = new UnknownFieldSet;  // A stand-in, to go on.
  missing->AddVarint(number, 0);
  return missing->field(missing->field_count() - 1);
}

double AsDouble(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
}
float AsFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

TEST(EventFileTest, Crc32cIsCastagnolisAndMaskedAsTfRecordMasksIt) {
  // The CRC-32C check value (RFC 3720's polynomial; "123456789" -> 0xE3069283).
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  const uint32_t crc = Crc32c("123456789");
  EXPECT_EQ(MaskedCrc32c("123456789"), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST(EventFileTest, ARecordIsLengthItsCrcTheDataAndItsCrc) {
  const std::string data = "hello, tensorboard";
  const std::string r = Record(data);
  ASSERT_EQ(r.size(), 8 + 4 + data.size() + 4);
  uint64_t len;
  std::memcpy(&len, r.data(), 8);
  EXPECT_EQ(len, data.size());
  uint32_t len_crc, data_crc;
  std::memcpy(&len_crc, r.data() + 8, 4);
  std::memcpy(&data_crc, r.data() + 12 + data.size(), 4);
  EXPECT_EQ(len_crc, MaskedCrc32c(r.substr(0, 8)));
  EXPECT_EQ(r.substr(12, data.size()), data);
  EXPECT_EQ(data_crc, MaskedCrc32c(data));
}

TEST(EventFileTest, EventsCarryTheirFieldsByTensorBoardsNumbers) {
  // Event: wall_time 1 (double), file_version 3.
  Fields version = Parse(FileVersionEvent(1700000000.5));
  EXPECT_EQ(AsDouble(Field(*version, 1).fixed64()), 1700000000.5);
  EXPECT_EQ(Field(*version, 3).length_delimited(), "brain.Event:2");

  // Event: step 2, summary 5 { value 1 { tag 1, simple_value 2 (float) } }.
  Fields scalar = Parse(ScalarEvent(12.25, 4242, "loss/rank1", 0.125f));
  EXPECT_EQ(AsDouble(Field(*scalar, 1).fixed64()), 12.25);
  EXPECT_EQ(Field(*scalar, 2).varint(), 4242u);
  Fields summary = Parse(Field(*scalar, 5).length_delimited());
  Fields value = Parse(Field(*summary, 1).length_delimited());
  EXPECT_EQ(Field(*value, 1).length_delimited(), "loss/rank1");
  EXPECT_EQ(AsFloat(Field(*value, 2).fixed32()), 0.125f);

  // Text: value { tag 1, tensor 8 { dtype 1 = DT_STRING (7), string_val 8 },
  // metadata 9 { plugin_data 1 { plugin_name 1 = "text" } } }.
  Fields text = Parse(TextEvent(3.0, 2, "attempts", "attempt 2: RUNNING"));
  EXPECT_EQ(Field(*text, 2).varint(), 2u);
  Fields text_summary = Parse(Field(*text, 5).length_delimited());
  Fields tv = Parse(Field(*text_summary, 1).length_delimited());
  EXPECT_EQ(Field(*tv, 1).length_delimited(), "attempts");
  Fields tensor = Parse(Field(*tv, 8).length_delimited());
  EXPECT_EQ(Field(*tensor, 1).varint(), 7u);
  EXPECT_EQ(Field(*tensor, 8).length_delimited(), "attempt 2: RUNNING");
  Fields metadata = Parse(Field(*tv, 9).length_delimited());
  Fields plugin = Parse(Field(*metadata, 1).length_delimited());
  EXPECT_EQ(Field(*plugin, 1).length_delimited(), "text");
}

TEST(EventFileTest, AFileStartsWithItsVersionAndIsReplacedWhole) {
  EventFile file(100.0);
  file.Scalar(101.0, 1, "loss/rank0", 2.5f);
  file.Text(102.0, 1, "attempts", "attempt 1: SUCCEEDED");
  EXPECT_EQ(file.events(), 3);
  EXPECT_EQ(file.bytes().substr(0, Record(FileVersionEvent(100.0)).size()),
            Record(FileVersionEvent(100.0)));
  const std::string dir = testing::MakeTempDir("event_file");
  const std::string path = dir + "/events.out.tfevents.test";
  ASSERT_TRUE(file.Write(path).ok());
  EXPECT_EQ(testing::ReadFile(path), file.bytes());
  EventFile smaller(100.0);
  ASSERT_TRUE(smaller.Write(path).ok());
  EXPECT_EQ(testing::ReadFile(path), smaller.bytes()) << "replaced, not appended to";
  EXPECT_FALSE(EventFile(1.0).Write(dir + "/no/such/dir/events.out.tfevents.x").ok());
}

}  // namespace
}  // namespace ddp::tensorboard
