// Hostile text from workers and trainers is made inert before ddpctl prints it.
#include "client/sanitize.h"

#include "ddp/v1/types.pb.h"
#include "gtest/gtest.h"

namespace ddp {
namespace {

TEST(SanitizeTest, StripsEscapeSequencesAndControlCharactersButKeepsText) {
  EXPECT_EQ(SanitizeText("\x1b[31mERROR\x1b[0m loss"), "ERROR loss") << "colors";
  EXPECT_EQ(SanitizeText("a\x1b]0;pwned title\x07" "b"), "ab") << "OSC window title";
  EXPECT_EQ(SanitizeText("a\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\b"), "alinkb") << "hyperlink";
  EXPECT_EQ(SanitizeText("x\x1b" "cy"), "xy") << "terminal reset";
  EXPECT_EQ(SanitizeText("progress\r50%\b\b"), "progress50%");
  EXPECT_EQ(SanitizeText("tab\tnew\nline"), "tab\tnew\nline");
  EXPECT_EQ(SanitizeText("a\xc2\x9b" "2Jb"), "ab") << "8-bit CSI";
  EXPECT_EQ(SanitizeText("evil\xe2\x80\xae" "txt.exe"), "eviltxt.exe") << "bidi override";
  EXPECT_EQ(SanitizeText("caf\xc3\xa9 \xe2\x96\x88"), "caf\xc3\xa9 \xe2\x96\x88") << "UTF-8 kept";
  EXPECT_EQ(SanitizeText("bad\xff" "byte"), "bad\xef\xbf\xbd" "byte");
  EXPECT_EQ(SanitizeText("\x1b"), "");
  EXPECT_EQ(SanitizeText("\x1b["), "");
}

TEST(SanitizeTest, SanitizesEveryStringFieldOfAMessage) {
  v1::Job job;
  job.set_reason("failed\x1b[2J");
  v1::Attempt* attempt = job.add_attempts();
  attempt->add_ranks()->set_worker("w\x1b]0;x\x07" "1");
  v1::Worker w;
  w.add_jobs("j\x07" "1");
  SanitizeMessage(&job);
  SanitizeMessage(&w);
  EXPECT_EQ(job.reason(), "failed");
  EXPECT_EQ(job.attempts(0).ranks(0).worker(), "w1");
  EXPECT_EQ(w.jobs(0), "j1");
}

}  // namespace
}  // namespace ddp
