#include "worker/agent/output_pump.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/time/clock.h"
#include "common/logging.h"
#include "google/protobuf/util/json_util.h"

namespace ddp {

bool ParseTrainerEvent(const std::string& line, v1::TrainerEvent* event) {
  if (line.empty() || line[0] != '{') return false;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  return google::protobuf::util::JsonStringToMessage(line, event, options).ok() &&
         !event->type().empty();
}

OutputPump::OutputPump(EventBuffer* out, Clock* clock) : out_(out), clock_(clock) {
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) wake_[0] = wake_[1] = -1;
  thread_ = std::thread([this] { Loop(); });
}

OutputPump::~OutputPump() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (wake_[1] >= 0) (void)!::write(wake_[1], "x", 1);
  thread_.join();
  absl::MutexLock lock(&mu_);
  for (auto& s : streams_) ::close(s->fd);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

void OutputPump::Add(const OutputSource& source, int events_fd, int stdout_fd, int stderr_fd) {
  {
    absl::MutexLock lock(&mu_);
    for (auto [fd, kind] : {std::pair{events_fd, Kind::kEvents},
                            std::pair{stdout_fd, Kind::kStdout},
                            std::pair{stderr_fd, Kind::kStderr}}) {
      if (fd < 0) continue;
      streams_.push_back(std::make_unique<Stream>(Stream{source, kind, fd, LineSplitter()}));
      ++open_[source];
    }
  }
  (void)!::write(wake_[1], "x", 1);
}

bool OutputPump::Drained(const OutputSource& source) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(source);
  return it == open_.end() || it->second == 0;
}

void OutputPump::Forget(const OutputSource& source) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(source);
  if (it != open_.end() && it->second == 0) open_.erase(it);
}

void OutputPump::Emit(const Stream& s, const std::string& line) {
  v1::ReportedEvent ev;
  ev.set_job_id(s.source.job_id);
  ev.set_attempt(s.source.attempt);
  ev.set_rank(s.source.rank);
  ev.set_time_ms(absl::ToUnixMillis(clock_->Now()));
  if (s.kind == Kind::kEvents) {
    v1::TrainerEvent event;
    if (ParseTrainerEvent(line, &event)) {
      if (event.type() == "trace" || event.type() == "buckets") return;
      *ev.mutable_event() = std::move(event);
      out_->Push(std::move(ev));
      return;
    }
  }
  v1::LogLine* log = ev.mutable_log();
  log->set_stream(s.kind == Kind::kStderr ? "stderr" : "stdout");
  log->set_rank(s.source.rank);
  log->set_attempt(s.source.attempt);
  log->set_text(line);
  out_->Push(std::move(ev));
}

void OutputPump::Loop() {
  std::vector<pollfd> fds;
  std::vector<Stream*> owners;
  while (true) {
    fds.clear();
    owners.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    owners.push_back(nullptr);
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      for (auto& s : streams_) {
        fds.push_back({s->fd, POLLIN, 0});
        owners.push_back(s.get());
      }
    }
    if (::poll(fds.data(), fds.size(), 1000) < 0) {
      if (errno == EINTR) continue;
      // Keep going: returning would leave every trainer blocked on a full pipe.
      if (poll_errors_++ % 100 == 0) {
        DDP_LOG(ERROR) << "output pump: poll over " << fds.size()
                       << " descriptors failed: " << std::strerror(errno) << " (retrying)";
      }
      absl::SleepFor(absl::Milliseconds(10));
      continue;
    }
    if (fds[0].revents) {
      char buf[64];
      while (::read(wake_[0], buf, sizeof(buf)) > 0) {
      }
    }
    std::vector<Stream*> closed;
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Stream* s = owners[i];
      char buf[65536];
      ssize_t n = ::read(s->fd, buf, sizeof(buf));
      if (n > 0) {
        s->splitter.Feed(buf, static_cast<size_t>(n), [&](const std::string& l) { Emit(*s, l); });
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        s->splitter.Flush([&](const std::string& l) { Emit(*s, l); });
        closed.push_back(s);
      }
    }
    if (closed.empty()) continue;
    absl::MutexLock lock(&mu_);
    for (Stream* s : closed) {
      ::close(s->fd);
      --open_[s->source];
      for (auto it = streams_.begin(); it != streams_.end(); ++it) {
        if (it->get() == s) {
          streams_.erase(it);
          break;
        }
      }
    }
  }
}

}  // namespace ddp
