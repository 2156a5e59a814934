#include "ddp/report.h"

#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <string>

#include "common/contract/events.h"
#include "common/contract/launch_env.h"
#include "common/json_writer.h"
#include "libddp/engine/gpu_memory.h"

namespace ddp {
namespace {

constexpr size_t kMaxLine = 64 * 1024;  // As ddp_report.py: longer lines are dropped.

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int FdFromEnvironment() {
  const char* fd = std::getenv(env::kEventsFd);
  if (fd != nullptr && *fd != '\0') {
    char* end = nullptr;
    const long v = std::strtol(fd, &end, 10);
    return *end == '\0' && v >= 0 && v < (1 << 20) ? static_cast<int>(v) : -1;
  }
  const char* out = std::getenv("DDP_REPORT_STDOUT");
  return out != nullptr && std::string(out) == "1" ? STDOUT_FILENO : -1;
}

void Optional(JsonObject& o, const char* key, int64_t v) {
  if (v >= 0) o.Add(key, v);
}
void Optional(JsonObject& o, const char* key, double v) {
  if (std::isfinite(v)) o.Add(key, v);
}

}  // namespace

GpuMemory gpu_memory(int device) {
  GpuMemory out;
  if (std::optional<GpuMemoryStats> m = GpuMemoryOf(device)) {
    out.allocated_mib = m->allocated_mib;
    out.reserved_mib = m->reserved_mib;
    out.peak_mib = m->peak_mib;
  }
  return out;
}

Reporter::Reporter() : fd_(FdFromEnvironment()) {}
Reporter::Reporter(int fd) : fd_(fd) {}

void Reporter::Write(const std::string& line) {
  if (line.size() > kMaxLine) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return;
  // A reader that went away must not kill the program with SIGPIPE: block it for this
  // write and swallow the one it raised.
  sigset_t pipe_set, old_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
  size_t done = 0;
  bool broken = false;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      // EAGAIN (a full non-blocking pipe): this line is dropped, training does not wait.
      broken = !(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
      break;
    }
  }
  if (broken) {
    fd_ = -1;  // EPIPE or a closed descriptor: stop reporting, keep training.
    const struct timespec zero = {0, 0};
    sigtimedwait(&pipe_set, nullptr, &zero);
  }
  pthread_sigmask(SIG_SETMASK, &old_set, nullptr);
}

void Reporter::step(const StepReport& r) {
  if (!enabled() || !std::isfinite(r.loss)) return;
  JsonObject o;
  o.Add("type", StepEvent::kType).Add("loss", r.loss);
  Optional(o, "epoch", r.epoch);
  Optional(o, "step", r.step);
  Optional(o, "steps", r.steps);
  Optional(o, "global_step", r.global_step);
  Optional(o, "samples_per_s", r.samples_per_s);
  Optional(o, "step_ms", r.step_ms);
  Optional(o, "comm_ms", r.comm_ms);
  Optional(o, "lr", r.lr);
  Optional(o, "gpu_memory_allocated_mib", r.gpu_memory_allocated_mib);
  Optional(o, "gpu_memory_reserved_mib", r.gpu_memory_reserved_mib);
  Optional(o, "gpu_memory_peak_mib", r.gpu_memory_peak_mib);
  Optional(o, "data_ms", r.data_ms);
  Optional(o, "compute_ms", r.compute_ms);
  Optional(o, "optimizer_ms", r.optimizer_ms);
  o.Add("time", Now());
  Write(o.Line());
}

void Reporter::epoch(const EpochReport& r) {
  if (!enabled()) return;
  JsonObject o;
  o.Add("type", EpochEvent::kType);
  Optional(o, "epoch", r.epoch);
  Optional(o, "train_loss", r.train_loss);
  Optional(o, "val_loss", r.val_loss);
  Optional(o, "val_accuracy", r.val_accuracy);
  o.Add("time", Now());
  Write(o.Line());
}

void Reporter::checkpoint(const std::string& path, int64_t epoch, int64_t step,
                          int64_t global_step) {
  if (!enabled()) return;
  JsonObject o;
  o.Add("type", CheckpointEvent::kType).Add("path", path);
  Optional(o, "epoch", epoch);
  Optional(o, "step", step);
  Optional(o, "global_step", global_step);
  o.Add("time", Now());
  Write(o.Line());
}

void Reporter::error(const std::string& message, bool retryable) {
  if (!enabled()) return;
  JsonObject o;
  o.Add("type", ErrorEvent::kType).Add("message", message).Add("retryable", retryable);
  o.Add("time", Now());
  Write(o.Line());
}

void Reporter::done(int64_t epochs, int64_t global_step) {
  if (!enabled()) return;
  JsonObject o;
  o.Add("type", DoneEvent::kType);
  Optional(o, "epochs", epochs);
  Optional(o, "global_step", global_step);
  o.Add("time", Now());
  Write(o.Line());
}

void Reporter::recovered(int64_t generation, int64_t source_rank, int64_t global_step,
                         double wait_ms, double sync_ms) {
  if (!enabled()) return;
  JsonObject o;
  o.Add("type", RecoveredEvent::kType)
      .Add("generation", generation)
      .Add("source_rank", source_rank)
      .Add("global_step", global_step)
      .Add("wait_ms", wait_ms)
      .Add("sync_ms", sync_ms);
  o.Add("time", Now());
  Write(o.Line());
}

}  // namespace ddp
