#include "common/flags.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct Options {
  std::string state_dir = "/var/lib/ddp";
  int64_t slots = 1;
  bool verbose = false;
  absl::Duration interval = absl::Seconds(1);
};

FlagSet MakeFlags(Options* o) {
  FlagSet f("prog", "test program");
  f.String("state-dir", &o->state_dir, "where state lives");
  f.Int("slots", &o->slots, "slots");
  f.Bool("verbose", &o->verbose, "chatty");
  f.Duration("interval", &o->interval, "how often");
  f.Alias("s", "slots");
  return f;
}

TEST(FlagSetTest, ParsesBothFormsAndKeepsPositionals) {
  Options o;
  FlagSet f = MakeFlags(&o);
  auto pos = f.Parse({"submit", "--state-dir=/tmp/x", "--slots", "4", "job.yaml", "--verbose",
                      "--interval=250ms"});
  ASSERT_TRUE(pos.ok()) << pos.status();
  EXPECT_THAT(*pos, ElementsAre("submit", "job.yaml"));
  EXPECT_EQ(o.state_dir, "/tmp/x");
  EXPECT_EQ(o.slots, 4);
  EXPECT_TRUE(o.verbose);
  EXPECT_EQ(o.interval, absl::Milliseconds(250));
}

TEST(FlagSetTest, AliasAndDoubleDash) {
  Options o;
  FlagSet f = MakeFlags(&o);
  auto pos = f.Parse({"-s", "3", "--", "--not-a-flag"});
  ASSERT_TRUE(pos.ok());
  EXPECT_EQ(o.slots, 3);
  EXPECT_THAT(*pos, ElementsAre("--not-a-flag"));
}

TEST(FlagSetTest, ErrorsNameTheFlag) {
  Options o;
  FlagSet f = MakeFlags(&o);
  EXPECT_THAT(f.Parse({"--slots=many"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--slots: expected an integer, got 'many'")));
  EXPECT_THAT(f.Parse({"--bogus"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown flag --bogus")));
  EXPECT_THAT(f.Parse({"--interval=soon"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--interval")));
}

TEST(FlagSetTest, UsageListsDefaults) {
  Options o;
  FlagSet f = MakeFlags(&o);
  std::string usage = f.Usage();
  EXPECT_THAT(usage, HasSubstr("--state-dir"));
  EXPECT_THAT(usage, HasSubstr("(default: /var/lib/ddp)"));
  EXPECT_THAT(usage, HasSubstr("--slots, -s"));
}

TEST(FlagSetTest, AStringListCollectsEveryOccurrence) {
  std::vector<std::string> roots;
  FlagSet flags("t", "");
  flags.StringList("allow-root", &roots, "a root");
  auto rest = flags.Parse(std::vector<std::string>{"--allow-root", "/a", "--allow-root=/b", "x"});
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ(roots, (std::vector<std::string>{"/a", "/b"}));
  EXPECT_EQ(*rest, (std::vector<std::string>{"x"}));
}

TEST(FlagSetTest, DescribeListsEveryFlagWithItsAliasesAndWhetherItTakesAValue) {
  Options o;
  FlagSet f = MakeFlags(&o);
  std::vector<FlagSet::Info> info = f.Describe();
  ASSERT_FALSE(info.empty());
  bool saw_slots = false;
  for (const FlagSet::Info& i : info) {
    EXPECT_FALSE(i.help.empty()) << i.name;
    if (i.name == "slots") {
      saw_slots = true;
      EXPECT_TRUE(i.takes_value);
      EXPECT_EQ(i.aliases, std::vector<std::string>{"s"});
    }
    if (i.name == "verbose") {
      EXPECT_FALSE(i.takes_value);
      EXPECT_TRUE(i.aliases.empty());
    }
  }
  EXPECT_TRUE(saw_slots);
}

}  // namespace
}  // namespace ddp
