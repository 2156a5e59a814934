// Prometheus as operators run it: a real Prometheus server (Debian's `prometheus`,
// started here on a loopback port with a generated config) scrapes a coordinator
// running a 2-worker job and both workers; the test asks Prometheus' HTTP API for
// what it stored, and `promtool check metrics` lints both endpoints. Exits 77
// (skipped) when prometheus or promtool is missing; scripts/install_deps.sh
// installs them, so CI runs it.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/ports.h"
#include "tests/common/probes.h"
#include "tests/common/test_util.h"
#include "tests/integration/local_cluster.h"

namespace ddp {
namespace {

using testing::CtlResult;
using testing::LocalCluster;
using ::testing::HasSubstr;
using ::testing::Not;

std::string FindTool(const std::string& name) {
  for (const std::string& dir : {std::string("/usr/bin"), std::string("/usr/local/bin")}) {
    const std::string path = dir + "/" + name;
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (absl::ascii_isalnum(c) || c == '_' || c == '-' || c == '.') {
      out += static_cast<char>(c);
    } else {
      out += absl::StrFormat("%%%02X", c);
    }
  }
  return out;
}

// The series of an instant-vector answer of Prometheus' /api/v1/query, each as its
// labels' JSON text and its value. A small reader for the one shape the API answers
// with ({"metric":{...},"value":[ts,"v"]}), enough for a test's assertions.
std::vector<std::pair<std::string, double>> Series(const std::string& body) {
  std::vector<std::pair<std::string, double>> out;
  size_t pos = 0;
  while ((pos = body.find("\"metric\":{", pos)) != std::string::npos) {
    const size_t labels_end = body.find('}', pos);
    const size_t value = body.find("\"value\":[", labels_end);
    if (labels_end == std::string::npos || value == std::string::npos) break;
    const size_t open = body.find(",\"", value);
    const size_t close = body.find('"', open + 2);
    double v = 0;
    if (open == std::string::npos || close == std::string::npos ||
        !absl::SimpleAtod(body.substr(open + 2, close - open - 2), &v)) {
      break;
    }
    out.emplace_back(body.substr(pos + 9, labels_end - pos - 8), v);
    pos = close;
  }
  return out;
}

class MetricsClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prometheus_bin_ = FindTool("prometheus");
    promtool_ = FindTool("promtool");
    if (prometheus_bin_.empty() || promtool_.empty()) {
      std::cerr << "skipped: prometheus and promtool are needed (apt-get install prometheus; "
                   "scripts/install_deps.sh does)\n";
      std::exit(77);
    }
    auto port = ::ddp::testing::ClaimPort();
    ASSERT_TRUE(port.ok()) << port.status();
    coordinator_metrics_ = *port;
    LocalCluster::Options o;
    o.worker_metrics = true;
    o.coordinator_flags = {absl::StrCat("--metrics-listen=127.0.0.1:", coordinator_metrics_)};
    auto cluster = LocalCluster::Start(o);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
  }

  void TearDown() override {
    if (prometheus_) prometheus_->Terminate(absl::Seconds(10));
  }

  // Starts Prometheus scraping the coordinator and both workers every second.
  void StartPrometheus() {
    const std::string dir = cluster_->dir() + "/prometheus";
    const std::string config = dir + "/prometheus.yml";
    std::filesystem::create_directories(dir);
    testing::WriteFile(
        config,
        absl::StrCat("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                     "scrape_configs:\n"
                     "  - job_name: ddp-coordinator\n"
                     "    static_configs: [{targets: ['127.0.0.1:",
                     coordinator_metrics_, "']}]\n"
                     "  - job_name: ddp-worker\n"
                     "    static_configs: [{targets: ['127.0.0.1:",
                     cluster_->worker_metrics_port(0), "', '127.0.0.1:",
                     cluster_->worker_metrics_port(1), "']}]\n"));
    auto port = ::ddp::testing::ClaimPort();
    ASSERT_TRUE(port.ok()) << port.status();
    prometheus_port_ = *port;
    SpawnOptions o;
    o.argv = {prometheus_bin_, "--config.file=" + config, "--storage.tsdb.path=" + dir + "/tsdb",
              absl::StrCat("--web.listen-address=127.0.0.1:", prometheus_port_),
              "--log.level=warn"};
    auto proc = Subprocess::Spawn(o);
    ASSERT_TRUE(proc.ok()) << proc.status();
    prometheus_ = std::move(*proc);
  }

  // Asks Prometheus `query` until `want` holds for its series (scrapes come every
  // second; Prometheus itself takes a moment to start).
  std::vector<std::pair<std::string, double>> QueryUntil(
      const std::string& query,
      const std::function<bool(const std::vector<std::pair<std::string, double>>&)>& want) {
    std::vector<std::pair<std::string, double>> series;
    std::string last;
    const absl::Time deadline = absl::Now() + absl::Minutes(2);
    while (absl::Now() < deadline) {
      auto body = testing::HttpGet(prometheus_port_, "/api/v1/query?query=" + UrlEncode(query));
      last = body.ok() ? *body : std::string(body.status().message());
      if (body.ok()) {
        series = Series(*body);
        if (want(series)) return series;
      }
      absl::SleepFor(absl::Milliseconds(250));  // Prometheus is another process: poll.
    }
    ADD_FAILURE() << "Prometheus never answered " << query << " as wanted; last: " << last;
    return series;
  }

  // `promtool check metrics` on what `port`'s /metrics serves.
  void Lint(int port, const std::string& name) {
    auto body = testing::HttpGet(port, "/metrics");
    ASSERT_TRUE(body.ok()) << body.status();
    const std::string file = absl::StrCat(cluster_->dir(), "/", name, ".prom");
    testing::WriteFile(file, *body);
    CtlResult r = testing::RunCapture({"/bin/sh", "-c", promtool_ + " check metrics < " + file},
                                      absl::Minutes(1));
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.out << r.err << "\n" << *body;
  }

  std::string prometheus_bin_, promtool_;
  int coordinator_metrics_ = 0;
  int prometheus_port_ = 0;
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<Subprocess> prometheus_;
};

TEST_F(MetricsClusterTest, PrometheusStoresBothRanksThroughputAndTheWorkersAndPromtoolAgrees) {
  const std::string spec = absl::StrCat(cluster_->dir(), "/long.yaml");
  testing::WriteFile(spec, R"(name: scraped
nodes: 2
model: {mlp: {hidden: [128, 128]}}
data: {synthetic: {samples: 20000, features: 64, classes: 10}}
train: {epochs: 100, batch_size: 32, optimizer: {name: adam, lr: 0.001}}
metrics: {every_steps: 5}
)");
  CtlResult submitted = cluster_->Ctl({"submit", spec});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  const std::string id(absl::StripAsciiWhitespace(submitted.out));
  auto running = cluster_->WaitFor(id, [](const v1::Job& j) {
    return j.state() == v1::RUNNING && j.metrics_size() == 2;
  });
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->state(), v1::RUNNING);
  StartPrometheus();

  // Both ranks' throughput, labelled with the job, rank and worker, as Prometheus
  // stored it from the coordinator's scrapes.
  auto ranks = QueryUntil(absl::StrCat("ddp_rank_samples_per_second{job_id=\"", id, "\"}"),
                          [](const auto& s) { return s.size() == 2; });
  ASSERT_EQ(ranks.size(), 2u);
  std::set<std::string> seen;
  for (const auto& [labels, value] : ranks) {
    EXPECT_GT(value, 0) << labels;
    EXPECT_THAT(labels, HasSubstr("\"job\":\"ddp-coordinator\"")) << "the scrape job";
    EXPECT_THAT(labels, HasSubstr(absl::StrCat("\"job_id\":\"", id, "\"")));
    for (const std::string rank : {"0", "1"}) {
      if (absl::StrContains(labels, "\"rank\":\"" + rank + "\"")) seen.insert(rank);
    }
  }
  EXPECT_EQ(seen, (std::set<std::string>{"0", "1"}));
  EXPECT_EQ(QueryUntil("ddp_rank_loss", [](const auto& s) { return s.size() == 2; }).size(), 2u);
  // Where each rank's step went: data, compute, communication and optimizer, per rank.
  EXPECT_EQ(QueryUntil(absl::StrCat("ddp_rank_step_phase_seconds{job_id=\"", id, "\"}"),
                       [](const auto& s) { return s.size() == 8; })
                .size(),
            8u);
  EXPECT_EQ(QueryUntil(absl::StrCat("ddp_rank_step_phase_seconds{job_id=\"", id,
                                    "\",phase=\"compute\"}"),
                       [](const auto& s) { return s.size() == 2; })
                .size(),
            2u);

  auto alive = QueryUntil("ddp_workers{state=\"alive\"}",
                          [](const auto& s) { return s.size() == 1 && s[0].second == 2; });
  ASSERT_EQ(alive.size(), 1u);
  EXPECT_EQ(alive[0].second, 2);
  // Each worker runs one trainer of the job: the node's view, from both workers.
  auto trainers = QueryUntil("ddp_worker_trainers", [](const auto& s) {
    return s.size() == 2 && s[0].second == 1 && s[1].second == 1;
  });
  EXPECT_EQ(trainers.size(), 2u);
  auto running_jobs = QueryUntil("ddp_jobs{state=\"running\"}",
                                 [](const auto& s) { return s.size() == 1 && s[0].second == 1; });
  EXPECT_EQ(running_jobs.size(), 1u);

  Lint(coordinator_metrics_, "coordinator");
  Lint(cluster_->worker_metrics_port(0), "worker");

  // Every metric the Grafana dashboard charts is one the daemons serve.
  auto coordinator_body = testing::HttpGet(coordinator_metrics_, "/metrics");
  auto worker_body = testing::HttpGet(cluster_->worker_metrics_port(0), "/metrics");
  ASSERT_TRUE(coordinator_body.ok() && worker_body.ok());
  const std::string dashboard =
      testing::ReadFile(testing::SourceDir() + "/deploy/grafana/ddp-dashboard.json");
  std::set<std::string> charted;
  for (size_t pos = 0; (pos = dashboard.find("ddp_", pos)) != std::string::npos;) {
    size_t end = pos + 4;
    while (end < dashboard.size() && (absl::ascii_islower(dashboard[end]) || dashboard[end] == '_')) {
      ++end;
    }
    charted.insert(dashboard.substr(pos, end - pos));
    pos = end;
  }
  EXPECT_GE(charted.size(), 15u);
  for (const std::string& metric : charted) {
    EXPECT_TRUE(absl::StrContains(*coordinator_body, "\n" + metric + "{") ||
                absl::StrContains(*coordinator_body, "\n" + metric + " ") ||
                absl::StrContains(*worker_body, "\n" + metric + " "))
        << "deploy/grafana/ddp-dashboard.json charts " << metric << ", which nothing serves";
  }

  // A finished job's rank series are gone from the next scrape.
  CtlResult cancelled = cluster_->Ctl({"cancel", id});
  ASSERT_EQ(cancelled.exit_code, 0) << cancelled.err;
  auto body = testing::HttpGet(coordinator_metrics_, "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, Not(HasSubstr("job_id=\"" + id)));
  EXPECT_THAT(*body, HasSubstr("ddp_jobs{state=\"cancelled\"} 1\n"));
}

}  // namespace
}  // namespace ddp
