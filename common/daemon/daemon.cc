#include "common/daemon/daemon.h"

#include <pthread.h>
#include <systemd/sd-daemon.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <iostream>

namespace ddp::daemon {

std::optional<int> ParseFlags(FlagSet& flags, int argc, char** argv) {
  auto positional = flags.Parse(argc, argv);
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    return kExitOk;
  }
  if (!positional.ok()) return UsageError(flags.program(), positional.status(), &flags);
  if (!positional->empty()) {
    return UsageError(flags.program(),
                      absl::InvalidArgumentError("unexpected argument " + positional->front()),
                      &flags);
  }
  return std::nullopt;
}

int UsageError(const std::string& program, const absl::Status& status, const FlagSet* flags) {
  std::cerr << program << ": " << status.message() << "\n";
  if (flags != nullptr) std::cerr << flags->Usage();
  return kExitUsage;
}

int StartError(const std::string& program, const absl::Status& status) {
  std::cerr << program << ": " << status.message() << "\n";
  return kExitCannotStart;
}

ShutdownSignals::ShutdownSignals(bool reload) {
  sigemptyset(&set_);
  sigaddset(&set_, SIGTERM);
  sigaddset(&set_, SIGINT);
  if (reload) sigaddset(&set_, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);
}

int ShutdownSignals::Wait() {
  int sig = 0;
  while (sigwait(&set_, &sig) != 0) {
  }
  return sig;
}

int ShutdownSignals::WaitFor(absl::Duration timeout) {
  const int64_t ns = std::max<int64_t>(0, absl::ToInt64Nanoseconds(timeout));
  struct timespec ts = {static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  for (;;) {
    const int sig = sigtimedwait(&set_, nullptr, &ts);
    if (sig > 0) return sig;
    if (errno == EAGAIN) return 0;
    // EINTR: another signal interrupted the wait; wait again (a little long, at worst).
  }
}

const char* ShutdownSignals::Name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    default: return "a signal";
  }
}

void NotifyReady(const std::string& status) {
  sd_notifyf(0, "READY=1\nSTATUS=%s", status.c_str());
}

void NotifyStatus(const std::string& status) { sd_notifyf(0, "STATUS=%s", status.c_str()); }

void NotifyStopping() { sd_notify(0, "STOPPING=1"); }

}  // namespace ddp::daemon
