#include "libddp/engine/recovery.h"

#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "libddp/engine/comm.h"

namespace ddp {

absl::StatusOr<GenerationNews> ParseGenerationNews(const std::string& text) {
  std::vector<std::string> f =
      absl::StrSplit(absl::StripAsciiWhitespace(text), ' ', absl::SkipEmpty());
  GenerationNews news;
  if (f.size() != 3 || !absl::SimpleAtoi(f[0], &news.generation) || news.generation < 0 ||
      !absl::SimpleAtoi(f[2], &news.master_port) || news.master_port < 1 ||
      news.master_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "generation file: expected 'GENERATION MASTER_ADDR MASTER_PORT', got '",
        absl::StripAsciiWhitespace(text), "'"));
  }
  news.master_addr = f[1];
  return news;
}

std::optional<GenerationNews> NewerGeneration(const std::string& path, int current) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  absl::StatusOr<GenerationNews> news = ParseGenerationNews(text.str());
  if (news.ok() && news->generation > current) return *std::move(news);
  return std::nullopt;
}

absl::StatusOr<GenerationNews> AwaitGeneration(const std::string& path, int current,
                                               absl::Duration timeout) {
  if (path.empty()) {
    return absl::FailedPreconditionError(
        "no generation file (DDP_GENERATION_FILE): live recovery needs ddp-worker");
  }
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (std::optional<GenerationNews> news = NewerGeneration(path, current)) return *news;
    if (absl::Now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "no replacement within recovery_timeout_s (", absl::FormatDuration(timeout),
      "): generation ", current, " is still the newest in ", path));
}

Notice ReadNotice(const std::string& path) {
  Notice n;
  if (path.empty()) return n;
  std::ifstream file(path);
  std::string line;
  if (!std::getline(file, line)) return n;
  std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(' ', 2));
  if (f.size() < 2 || !absl::SimpleAtoi(f[0], &n.seq) || !absl::SimpleAtoi(f[1], &n.deadline_ms)) {
    return Notice{};
  }
  if (f.size() == 3) n.reason = f[2];
  return n;
}

absl::StatusOr<Environment> NextGeneration(const Environment& env, const absl::Status& cause,
                                           absl::Duration timeout) {
  absl::StatusOr<GenerationNews> news = AwaitGeneration(env.generation_file, env.generation,
                                                        timeout);
  if (!news.ok()) {
    return absl::Status(cause.code(), absl::StrCat(cause.message(), "; live recovery: ",
                                                   news.status().message()));
  }
  Environment next = env;
  next.generation = news->generation;
  next.master_addr = news->master_addr;
  next.master_port = news->master_port;
  return next;
}

bool PeerFailure(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable;
}

absl::StatusOr<StateSource> ChooseSource(Comm& comm, int64_t steps) {
  // Every rank's count, shifted by one (0: none), summed into a vector of all of them.
  at::Tensor counts = at::zeros({comm.world_size()}, at::kDouble);
  counts[comm.rank()] = static_cast<double>(steps + 1);
  at::Tensor on_device = counts.to(comm.device());
  DDP_RETURN_IF_ERROR(comm.AllReduceSum(on_device));
  counts = on_device.cpu();
  const double* c = counts.data_ptr<double>();
  StateSource source{-1, -1};
  for (int r = 0; r < comm.world_size(); ++r) {
    const int64_t held = static_cast<int64_t>(c[r]) - 1;
    if (held > source.global_step) source = {r, held};
  }
  if (source.rank < 0) {
    return absl::FailedPreconditionError(
        "live recovery: no rank of the new generation holds training state");
  }
  return source;
}

}  // namespace ddp
