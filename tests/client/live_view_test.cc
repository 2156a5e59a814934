// ddpctl's live-view comforts: straggler and stale marks in watch, logs --collapse,
// per-verb help, shell completion (run in a real bash and zsh), and version warnings.
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/collapse.h"
#include "client/completion.h"
#include "client/render.h"
#include "client/stragglers.h"
#include "client/verbs.h"
#include "common/version.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace ddp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

// A RUNNING job, attempt 1, with `n` ranks whose metrics arrived at kNow.
v1::Job RunningJob(int n, double step_ms, double comm_ms) {
  v1::Job job;
  job.set_id("j-aaaaa");
  job.set_state(v1::RUNNING);
  v1::Attempt* a = job.add_attempts();
  a->set_number(1);
  a->set_world_size(n);
  for (int r = 0; r < n; ++r) {
    v1::RankAssignment* ra = a->add_ranks();
    ra->set_rank(r);
    ra->set_worker(absl::StrCat("w", r));
    ra->set_pid(100 + r);
    v1::RankMetrics* m = job.add_metrics();
    m->set_rank(r);
    m->set_attempt(1);
    m->set_steps(10);
    m->set_step_ms(step_ms);
    m->set_comm_ms(comm_ms);
    m->set_update_ms(absl::ToUnixMillis(kNow));
  }
  return job;
}

TEST(RankNotesTest, MarksTheRankThatComputesLongestWithItsRatio) {
  // Steps take 100 ms everywhere (the all-reduce waits for the slowest); rank 2
  // computes for 90 ms while the others compute 30 ms and wait 70.
  v1::Job job = RunningJob(4, 100, 70);
  job.mutable_metrics(2)->set_comm_ms(10);
  auto notes = RankNotes(job, kNow);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[2], "straggler 3.0x");
}

TEST(RankNotesTest, AStragglersNoteNamesThePhaseItLosesItsTimeIn) {
  // Rank 1 computes 90 ms against 30; where it goes is in its phases.
  v1::Job job = RunningJob(3, 100, 70);
  job.mutable_metrics(1)->set_comm_ms(10);
  for (v1::RankMetrics& m : *job.mutable_metrics()) {
    m.set_data_ms(5);
    m.set_compute_ms(m.step_ms() - m.comm_ms() - 10);
    m.set_optimizer_ms(5);
  }
  EXPECT_EQ(RankNotes(job, kNow)[1], "straggler 3.0x (compute)");
  // The same excess in waiting for its batches instead.
  for (v1::RankMetrics& m : *job.mutable_metrics()) m.set_compute_ms(20);
  job.mutable_metrics(1)->set_data_ms(65);
  EXPECT_EQ(RankNotes(job, kNow)[1], "straggler 3.0x (data loading)");
  // A rank that does not say: the note without a phase.
  job.mutable_metrics(0)->clear_optimizer_ms();
  EXPECT_EQ(RankNotes(job, kNow)[1], "straggler 3.0x");
  // And watch's lines carry the phases.
  const std::string lines = absl::StrJoin(RenderWatchLines(job, nullptr, kNow), "\n");
  EXPECT_THAT(lines, HasSubstr("data_ms 65.0 compute_ms 20.0 optimizer_ms 5.0"));
}

TEST(RankNotesTest, EvenRanksAndSubMillisecondNoiseAreNotStragglers) {
  EXPECT_THAT(RankNotes(RunningJob(4, 100, 50), kNow), IsEmpty());
  v1::Job tiny = RunningJob(2, 1.0, 0.6);  // 0.4 ms against 0.9 ms: 2x but noise.
  tiny.mutable_metrics(1)->set_comm_ms(0.1);
  EXPECT_THAT(RankNotes(tiny, kNow), IsEmpty());
}

TEST(RankNotesTest, MarksARankWhoseUpdatesStoppedForManyStepTimes) {
  v1::Job job = RunningJob(2, 2000, 100);  // 2 s steps: stale after 10 x 2 s.
  job.mutable_metrics(1)->set_update_ms(absl::ToUnixMillis(kNow - absl::Seconds(15)));
  EXPECT_THAT(RankNotes(job, kNow), IsEmpty());
  job.mutable_metrics(1)->set_update_ms(absl::ToUnixMillis(kNow - absl::Seconds(25)));
  auto notes = RankNotes(job, kNow);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[1], "stale 25s");
}

TEST(RankNotesTest, StaleLimitScalesWithTheJobsMetricsCadence) {
  v1::Job job = RunningJob(2, 2000, 100);
  job.set_spec_yaml(
      "name: j\nnodes: 2\nmodel: {mlp: {hidden: [4]}}\n"
      "data: {synthetic: {samples: 64, features: 4, classes: 2}}\n"
      "train: {epochs: 1, batch_size: 8}\nmetrics: {every_steps: 5}\n");
  // Updates every 5 steps of 2 s: 25 s of silence is 2.5 intervals, not stale.
  job.mutable_metrics(1)->set_update_ms(absl::ToUnixMillis(kNow - absl::Seconds(25)));
  EXPECT_THAT(RankNotes(job, kNow), IsEmpty());
  job.mutable_metrics(1)->set_update_ms(absl::ToUnixMillis(kNow - absl::Seconds(101)));
  EXPECT_EQ(RankNotes(job, kNow)[1], "stale 1m41s");
}

TEST(RankNotesTest, NothingIsNotedOnceTheJobIsNotRunning) {
  v1::Job job = RunningJob(2, 100, 10);
  job.mutable_metrics(1)->set_comm_ms(90);
  job.set_state(v1::SUCCEEDED);
  EXPECT_THAT(RankNotes(job, kNow + absl::Hours(1)), IsEmpty());
}

TEST(RankNotesTest, WatchShowsTheNoteInItsTableAndItsLines) {
  v1::Job job = RunningJob(2, 100, 80);
  job.mutable_metrics(1)->set_comm_ms(10);  // Computes 90 ms against 20.
  ProgressEstimator progress;
  const std::string table = absl::StrJoin(RenderWatch(job, progress, kNow, false), "\n");
  EXPECT_THAT(table, HasSubstr("NOTE"));
  EXPECT_THAT(table, HasSubstr("straggler 4.5x"));
  const std::string lines = absl::StrJoin(RenderWatchLines(job, nullptr, kNow), "\n");
  EXPECT_THAT(lines, HasSubstr("rank 1 epoch 0 step 1/10"));
  EXPECT_THAT(lines, HasSubstr("straggler 4.5x"));
  // Without a note the table keeps its usual columns.
  EXPECT_THAT(absl::StrJoin(RenderWatch(RunningJob(2, 100, 50), progress, kNow, false), "\n"),
              Not(HasSubstr("NOTE")));
}

v1::LogLine Line(int rank, const std::string& text, int attempt = 1) {
  v1::LogLine l;
  l.set_rank(rank);
  l.set_attempt(attempt);
  l.set_stream("stdout");
  l.set_text(text);
  return l;
}

std::vector<std::string> Render(const std::vector<CollapsedLine>& lines) {
  std::vector<std::string> out;
  for (const CollapsedLine& l : lines) out.push_back(RenderCollapsedLine(l));
  return out;
}

TEST(CollapseTest, FoldsInterleavedIdenticalLinesFromEveryRankInOrder) {
  LineCollapser c({{1, 4}}, absl::Seconds(1));
  std::vector<std::string> out;
  auto add = [&](const v1::LogLine& l) {
    for (auto& s : Render(c.Add(l, kNow))) out.push_back(s);
  };
  for (int r : {2, 0, 3, 1}) add(Line(r, "loading data"));
  for (int r : {0, 1, 2, 3}) add(Line(r, absl::StrCat("rank ", r, " ready")));
  for (int r : {3, 2, 1, 0}) add(Line(r, "loading data"));  // The second time round.
  for (auto& s : Render(c.Flush())) out.push_back(s);
  EXPECT_THAT(out, ElementsAre("[ranks 0-3] loading data", "[rank 0] rank 0 ready",
                               "[rank 1] rank 1 ready", "[rank 2] rank 2 ready",
                               "[rank 3] rank 3 ready", "[ranks 0-3] loading data"));
}

TEST(CollapseTest, ALineOnlySomeRanksPrintLeavesAfterTheWindowWithThoseRanks) {
  LineCollapser c({{1, 4}}, absl::Seconds(1));
  EXPECT_THAT(c.Add(Line(0, "warning: slow disk"), kNow), IsEmpty());
  EXPECT_THAT(c.Add(Line(2, "warning: slow disk"), kNow), IsEmpty());
  EXPECT_THAT(c.Expire(kNow + absl::Milliseconds(500)), IsEmpty());
  EXPECT_THAT(Render(c.Expire(kNow + absl::Seconds(1))),
              ElementsAre("[ranks 0,2] warning: slow disk"));
}

TEST(CollapseTest, KeepsAttemptsAndStreamsApart) {
  LineCollapser c({{1, 2}, {2, 2}}, absl::Seconds(1));
  v1::LogLine err = Line(1, "boom");
  err.set_stream("stderr");
  c.Add(Line(0, "boom"), kNow);
  c.Add(err, kNow);
  c.Add(Line(1, "boom", 2), kNow);
  EXPECT_EQ(Render(c.Flush()).size(), 3u);
  EXPECT_EQ(FormatRanks({0, 1, 2, 3, 5, 7, 8, 10, 11, 12}), "0-3,5,7,8,10-12");
}

TEST(HelpTest, EveryVerbHasAnExampleAndItsFlags) {
  for (const Verb& v : Verbs()) {
    const std::string help = VerbHelp(v);
    EXPECT_THAT(help, HasSubstr(absl::StrCat("usage: ddpctl ", v.name))) << v.name;
    EXPECT_THAT(help, HasSubstr(absl::StrCat("example:\n  ", v.example))) << v.name;
    if (v.needs_coordinator) {
      EXPECT_THAT(help, HasSubstr("--coordinator")) << v.name;
    }
  }
  EXPECT_THAT(VerbHelp(*FindVerb("logs")), HasSubstr("--collapse"));
  EXPECT_THAT(VerbHelp(*FindVerb("workers")), HasSubstr("drain NAME"));
  EXPECT_THAT(GeneralUsage(), HasSubstr("completion bash|zsh"));
}

TEST(VerbTableTest, EveryVerbOwnsItsFlagsChecksAndHandler) {
  for (const Verb& v : Verbs()) {
    EXPECT_NE(v.flags, nullptr) << v.name;
    EXPECT_NE(v.check, nullptr) << v.name;
    EXPECT_NE(v.run, nullptr) << v.name;
  }
  // The checks run on parsed flags and arguments, before any connection is made.
  CtlFlags f;
  std::vector<std::string> args = {"drain", "node-7"};
  f.drain_now = true;
  ASSERT_TRUE(FindVerb("workers")->check(f, args).ok());
  EXPECT_EQ(f.action, "drain");
  EXPECT_EQ(args, std::vector<std::string>{"node-7"}) << "the action leaves the arguments";
  CtlFlags g;
  args = {"reboot", "node-7"};
  EXPECT_THAT(std::string(FindVerb("workers")->check(g, args).message()),
              HasSubstr("unknown action 'reboot'"));
  CtlFlags h;
  h.drain_wait = true;
  args = {};
  EXPECT_THAT(std::string(FindVerb("workers")->check(h, args).message()),
              HasSubstr("--wait and --now go with `drain`"));
  CtlFlags yaml;
  yaml.output = "yaml";
  EXPECT_THAT(std::string(FindVerb("get")->check(yaml, args).message()),
              HasSubstr("-o must be table or json (got 'yaml')"));
  CtlFlags svg;
  svg.output = "loss.svg";
  EXPECT_TRUE(FindVerb("plot")->check(svg, args).ok()) << "plot writes files";
}

struct Shell {
  int rc = -1;
  std::string out;
};

Shell RunShell(const std::string& cmd) {
  Shell r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// Completes COMP_WORDS with the generated script in a real bash; prints COMPREPLY.
std::string Complete(const std::string& script, const std::string& words, int cword) {
  Shell r = RunShell(absl::StrCat("bash --norc --noprofile -c 'source ", script,
                                  "; COMP_WORDS=(", words, "); COMP_CWORD=", cword,
                                  "; _ddpctl; echo \"${COMPREPLY[*]}\"' 2>&1"));
  EXPECT_EQ(r.rc, 0) << r.out;
  return r.out;
}

TEST(CompletionTest, BashScriptParsesAndCompletesVerbsFlagsAndValues) {
  auto script = CompletionScript("bash");
  ASSERT_TRUE(script.ok());
  const std::string dir = testing::MakeTempDir("completion");
  const std::string path = dir + "/ddpctl.bash";
  testing::WriteFile(path, *script);
  Shell syntax = RunShell(absl::StrCat("bash -n ", path, " 2>&1"));
  EXPECT_EQ(syntax.rc, 0) << syntax.out;
  EXPECT_EQ(Complete(path, "ddpctl su", 1), "submit\n");
  EXPECT_EQ(Complete(path, "ddpctl c", 1), "cancel completion\n");
  EXPECT_EQ(Complete(path, "ddpctl logs JOB --co", 3), "--coordinator --collapse\n");
  EXPECT_EQ(Complete(path, "ddpctl get JOB -o \"\"", 4), "table json\n");
  EXPECT_EQ(Complete(path, "ddpctl completion \"\"", 2), "bash zsh\n");
  EXPECT_EQ(Complete(path, "ddpctl workers \"\"", 2), "cordon uncordon drain rm\n");
  EXPECT_EQ(Complete(path, "ddpctl workers dr", 2), "drain\n");
  EXPECT_EQ(Complete(path, "ddpctl workers drain --n", 3), "--now\n");
  // A flag that takes a value offers nothing (not more flags) for the value.
  EXPECT_EQ(Complete(path, "ddpctl logs JOB --rank \"\"", 4), "\n");
  std::filesystem::remove_all(dir);
}

TEST(CompletionTest, ZshScriptParses) {
  if (RunShell("command -v zsh >/dev/null 2>&1").rc != 0) GTEST_SKIP() << "no zsh here";
  auto script = CompletionScript("zsh");
  ASSERT_TRUE(script.ok());
  EXPECT_THAT(*script, HasSubstr("#compdef ddpctl"));
  const std::string dir = testing::MakeTempDir("completion");
  testing::WriteFile(dir + "/_ddpctl", *script);
  Shell syntax = RunShell(absl::StrCat("zsh -n ", dir, "/_ddpctl 2>&1"));
  EXPECT_EQ(syntax.rc, 0) << syntax.out;
  std::filesystem::remove_all(dir);
}

TEST(CompletionTest, AnUnknownShellNamesTheChoices) {
  auto script = CompletionScript("fish");
  ASSERT_FALSE(script.ok());
  EXPECT_THAT(std::string(script.status().message()), HasSubstr("bash or zsh"));
}

TEST(VersionTest, WorkersShowTheirVersionAndThoseThatDifferAreWarnedAbout) {
  std::vector<v1::Worker> workers(3);
  workers[0].set_name("a");
  workers[0].set_version(VersionString());
  workers[1].set_name("b");
  workers[1].set_version("0.0.9 (git 123456789abc)");
  workers[2].set_name("c");  // Registered with an older coordinator: unknown.
  EXPECT_THAT(RenderWorkers(workers, kNow), HasSubstr("VERSION"));
  EXPECT_THAT(RenderWorkers(workers, kNow), HasSubstr("0.0.9 (git 123456789abc)"));
  auto warnings = WorkerVersionWarnings(workers, VersionString());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr("worker b runs ddp 0.0.9"));
  EXPECT_THAT(WorkerVersionWarnings(workers, ""), IsEmpty());
  // Many workers of one other build: one line, naming a few.
  std::vector<v1::Worker> fleet(1200);
  for (size_t i = 0; i < fleet.size(); ++i) {
    fleet[i].set_name(absl::StrCat("n", i));
    fleet[i].set_version("0.0.8");
  }
  auto grouped = WorkerVersionWarnings(fleet, VersionString());
  ASSERT_EQ(grouped.size(), 1u);
  EXPECT_THAT(grouped[0], HasSubstr("warning: 1,200 workers (n0, n1, n2, n3, n4 and 1,195 more) "
                                    "run ddp 0.0.8, the coordinator "));
  EXPECT_THAT(VersionString(), HasSubstr(kVersion));
}

}  // namespace
}  // namespace ddp
