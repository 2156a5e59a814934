#include "bench/loadgen/proc_stats.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ddp::loadgen {

absl::StatusOr<ProcSample> SampleProcess(pid_t pid) {
  ProcSample s;
  s.at = absl::Now();
  const std::string dir = absl::StrCat("/proc/", pid);
  std::ifstream stat(dir + "/stat");
  if (!stat) return absl::NotFoundError(absl::StrCat("no process ", pid));
  std::string line;
  std::getline(stat, line);
  // Fields after the command name (which may hold spaces) start after the last ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return absl::InternalError("unexpected " + dir + "/stat");
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  // state(3) ... utime is field 14, stime 15: the 12th and 13th after the name.
  uint64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15; ++i) {
    if (!(rest >> field)) return absl::InternalError("short " + dir + "/stat");
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  s.cpu_s = static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  std::ifstream status(dir + "/status");
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream v(line.substr(6));
      v >> s.rss_kb;
    }
  }
  return s;
}

double CoresBetween(const ProcSample& from, const ProcSample& to) {
  const double wall = absl::ToDoubleSeconds(to.at - from.at);
  return wall > 0 ? (to.cpu_s - from.cpu_s) / wall : 0;
}

}  // namespace ddp::loadgen
