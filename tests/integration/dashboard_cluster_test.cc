// The web dashboard in a real browser, over HTTPS: a secure cluster (TLS and tokens on
// the gRPC port, certificates from scripts/make_certs.sh) serves the dashboard on a
// loopback port with the coordinator's own certificate, runs the example job on two
// workers, and tests/integration/dashboard_browser.py drives Debian's headless Chromium
// (chromedriver, python3-selenium), trusting exactly that certificate, through the
// login form and the job's page with the viewer token: both ranks' rows, redrawn as
// steps arrive, both curves, no token refused, a token in the address never taken,
// logging out. Exits 77 (skipped) where chromium, chromedriver or selenium is missing.
//
// The screenshot goes to the cluster's scratch directory; with
// DDP_DASHBOARD_SCREENSHOT=PATH it is copied there too (how docs/images/dashboard-job.png
// is made: scripts/dashboard_screenshot.sh).
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "tests/common/ports.h"
#include "tests/common/test_util.h"
#include "tests/integration/local_cluster.h"

namespace ddp {
namespace {

using testing::CtlResult;
using testing::LocalCluster;

TEST(DashboardClusterTest, ViewerLogsInOverHttpsAndSeesBothRanksRedrawInHeadlessChromium) {
  auto port = ::ddp::testing::ClaimPort();
  ASSERT_TRUE(port.ok()) << port.status();
  LocalCluster::Options o;
  o.secure = true;
  o.coordinator_flags = {absl::StrCat("--http-listen=127.0.0.1:", *port)};
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;

  // The example job, long enough to be watched for a while (cancelled at the end).
  const std::string spec = testing::StageExample("cancer.yaml", c.dir());
  std::string yaml = testing::ReadFile(spec);
  ASSERT_NE(yaml.find("epochs: 100"), std::string::npos);
  yaml.replace(yaml.find("epochs: 100"), 11, "epochs: 5000");
  ASSERT_NE(yaml.find("every_steps: 1}"), std::string::npos);
  yaml.replace(yaml.find("every_steps: 1}"), 15, "every_steps: 5}");
  testing::WriteFile(spec, yaml);
  CtlResult submit = c.Ctl({"submit", spec});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string id(absl::StripAsciiWhitespace(submit.out));
  auto running = c.WaitFor(id, [](const v1::Job& j) {
    return j.state() == v1::RUNNING && j.metrics_size() == 2;
  });
  ASSERT_TRUE(running.ok()) << running.status();

  const std::string shot = c.dir() + "/dashboard-job.png";
  CtlResult browser = testing::RunCapture(
      {DDP_PYTHON3, testing::SourceDir() + "/tests/integration/dashboard_browser.py",
       "--url", absl::StrCat("https://127.0.0.1:", *port), "--job", id, "--token-file",
       c.certs() + "/viewer.token", "--ca", c.certs() + "/ca.pem", "--screenshot", shot},
      absl::Minutes(4));
  if (browser.exit_code == 77) {
    std::cerr << browser.err;
    std::exit(77);
  }
  EXPECT_EQ(browser.exit_code, 0) << browser.err << "\n" << browser.out;
  std::cout << "the browser saw: " << browser.out << "\n";
  // What it saw, besides its own verdict: the page redrew with newer steps of both ranks.
  EXPECT_NE(browser.out.find("\"failures\": []"), std::string::npos) << browser.out;
  EXPECT_NE(browser.out.find("\"no_token_page_status\": 401"), std::string::npos) << browser.out;
  EXPECT_NE(browser.out.find("\"secure\": true"), std::string::npos) << browser.out;
  ASSERT_TRUE(std::filesystem::exists(shot));
  EXPECT_GT(std::filesystem::file_size(shot), 20000u);  // A real page, not a blank one.
  if (const char* keep = std::getenv("DDP_DASHBOARD_SCREENSHOT"); keep && *keep) {
    std::filesystem::copy_file(shot, keep, std::filesystem::copy_options::overwrite_existing);
  }

  // The job was only watched: it is still running, and stops when cancelled.
  auto job = c.GetJob(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::RUNNING);
  CtlResult cancel = c.Ctl({"cancel", id});
  EXPECT_EQ(cancel.exit_code, 0) << cancel.err;
}

}  // namespace
}  // namespace ddp
