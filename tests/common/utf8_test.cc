// UTF-8 repair: what reaches a protobuf string field must be valid, whatever a trainer
// printed.
#include "common/utf8.h"

#include "common/json_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ddp {
namespace {

constexpr char kFffd[] = "\xEF\xBF\xBD";

TEST(Utf8Test, ValidTextIsKeptAsItIs) {
  for (const std::string s : {"", "plain ascii", "caf\xC3\xA9", "\xE2\x82\xAC 5",
                              "\xF0\x9F\x98\x80 emoji", "\xF4\x8F\xBF\xBF"}) {
    EXPECT_TRUE(IsValidUtf8(s)) << s;
    EXPECT_EQ(ToValidUtf8(s), s);
    std::string copy = s;
    EXPECT_FALSE(MakeValidUtf8(&copy));
  }
}

TEST(Utf8Test, Latin1BytesBecomeReplacementCharacters) {
  // "caf\xe9" is how Latin-1 spells "café".
  const std::string latin1 = "label,caf\xE9,x";
  EXPECT_FALSE(IsValidUtf8(latin1));
  EXPECT_EQ(ValidUtf8Prefix(latin1), 9u);
  EXPECT_EQ(ToValidUtf8(latin1), std::string("label,caf") + kFffd + ",x");
}

TEST(Utf8Test, EachMaximalInvalidSubpartIsReplacedOnce) {
  // A truncated 3-byte sequence is one subpart; stray continuation bytes, overlong
  // forms, surrogates and bytes above U+10FFFF are each replaced byte by byte.
  EXPECT_EQ(ToValidUtf8("a\xE2\x82" "b"), std::string("a") + kFffd + "b");
  EXPECT_EQ(ToValidUtf8("\x80\x80"), std::string(kFffd) + kFffd);
  EXPECT_EQ(ToValidUtf8("\xC0\xAF"), std::string(kFffd) + kFffd);          // Overlong '/'.
  EXPECT_EQ(ToValidUtf8("\xED\xA0\x80"), std::string(kFffd) + kFffd + kFffd);  // Surrogate.
  EXPECT_EQ(ToValidUtf8("\xF5\x80"), std::string(kFffd) + kFffd);
  EXPECT_EQ(ToValidUtf8("end\xF0\x9F\x98"), std::string("end") + kFffd);
  std::string s = "x\xFFy";
  EXPECT_TRUE(MakeValidUtf8(&s));
  EXPECT_TRUE(IsValidUtf8(s));
}

TEST(Utf8Test, CharLengthDecodesOneCharacterAndRefusesWhatIsNotOne) {
  uint32_t cp = 0;
  EXPECT_EQ(Utf8CharLength("A", 0, &cp), 1u);
  EXPECT_EQ(cp, 0x41u);
  EXPECT_EQ(Utf8CharLength("\xC3\xA9", 0, &cp), 2u);  // U+00E9
  EXPECT_EQ(cp, 0xE9u);
  EXPECT_EQ(Utf8CharLength("\xE2\x80\xAE", 0, &cp), 3u);  // U+202E, a bidi override
  EXPECT_EQ(cp, 0x202Eu);
  EXPECT_EQ(Utf8CharLength("\xF0\x9F\x98\x80", 0, &cp), 4u);  // U+1F600
  EXPECT_EQ(cp, 0x1F600u);
  EXPECT_EQ(Utf8CharLength("\xC0\xAF", 0), 0u) << "overlong";
  EXPECT_EQ(Utf8CharLength("\xED\xA0\x80", 0), 0u) << "surrogate";
  EXPECT_EQ(Utf8CharLength("\xF4\x90\x80\x80", 0), 0u) << "above U+10FFFF";
  EXPECT_EQ(Utf8CharLength("\xE2\x80", 0), 0u) << "cut short";
  EXPECT_EQ(Utf8CharLength("\x80", 0), 0u) << "a stray continuation byte";
}

TEST(Utf8Test, SafeCutNeverSplitsACharacter) {
  const std::string s = "ab\xE2\x82\xAC" "cd";  // a b EURO c d
  EXPECT_EQ(Utf8SafeCut(s, 100), s.size());
  EXPECT_EQ(Utf8SafeCut(s, 2), 2u);
  EXPECT_EQ(Utf8SafeCut(s, 3), 2u);
  EXPECT_EQ(Utf8SafeCut(s, 4), 2u);
  EXPECT_EQ(Utf8SafeCut(s, 5), 5u);
}

TEST(Utf8Test, JsonEscapeAlwaysWritesValidUtf8) {
  JsonObject o;
  o.Add("message", "data.csv:1: expected a number, got 'caf\xE9'");
  EXPECT_TRUE(IsValidUtf8(o.str()));
  EXPECT_THAT(o.str(), ::testing::HasSubstr(std::string("caf") + kFffd));
}

}  // namespace
}  // namespace ddp
