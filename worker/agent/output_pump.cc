#include "worker/agent/output_pump.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/utf8.h"
#include "worker/agent/proto_utf8.h"
#include "worker/agent/trainer_event_parser.h"

namespace ddp {

OutputPump::OutputPump(EventBuffer* out, Clock* clock, std::function<void()> on_push)
    : out_(out), clock_(clock), on_push_(std::move(on_push)) {
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

void OutputPump::Add(const OutputSource& source, int events_fd, int stdout_fd, int stderr_fd,
                     EventCheck check) {
  {
    absl::MutexLock lock(&mu_);
    for (auto [fd, kind] : {std::pair{events_fd, Kind::kEvents},
                            std::pair{stdout_fd, Kind::kStdout},
                            std::pair{stderr_fd, Kind::kStderr}}) {
      if (fd < 0) continue;
      const size_t max_line = kind == Kind::kEvents ? kMaxEventLineBytes : kMaxLineBytes;
      streams_.push_back(
          std::make_unique<Stream>(Stream{source, kind, fd, LineCutter(max_line), check}));
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

bool OutputPump::Unread(const OutputSource& source) {
  absl::MutexLock lock(&mu_);
  if (reading_ != nullptr && reading_->source.job_id == source.job_id &&
      reading_->source.attempt == source.attempt && reading_->source.rank == source.rank) {
    return true;
  }
  for (const auto& s : streams_) {
    int n = 0;
    if (s->source.job_id == source.job_id && s->source.attempt == source.attempt &&
        s->source.rank == source.rank && ::ioctl(s->fd, FIONREAD, &n) == 0 && n > 0) {
      return true;
    }
  }
  return false;
}

void OutputPump::Forget(const OutputSource& source) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(source);
  if (it != open_.end() && it->second == 0) open_.erase(it);
}

v1::ReportedEvent OutputPump::Envelope(const Stream& s) {
  v1::ReportedEvent ev;
  ev.set_job_id(s.source.job_id);
  ev.set_attempt(s.source.attempt);
  ev.set_rank(s.source.rank);
  ev.set_time_ms(absl::ToUnixMillis(clock_->Now()));
  return ev;
}

v1::ReportedEvent OutputPump::LogEvent(const Stream& s, const char* stream, std::string text) {
  v1::ReportedEvent ev = Envelope(s);
  v1::LogLine* log = ev.mutable_log();
  log->set_stream(stream);
  log->set_rank(s.source.rank);
  log->set_attempt(s.source.attempt);
  log->set_text(std::move(text));
  return ev;
}

void OutputPump::Push(v1::ReportedEvent ev) {
  // What JSON escapes may have made of the text (a lone surrogate, \u0000...). Log
  // lines are valid already, and the job id came from a parsed message.
  if (ev.has_event()) RepairUtf8(ev.mutable_event());
  out_->Push(std::move(ev));
  if (on_push_) on_push_();
}

void OutputPump::Malformed(Stream& s, const std::string& text, const std::string& why) {
  ++malformed_total_;
  if (s.malformed++ > 0) return;
  constexpr size_t kShown = 200;
  std::string shown = text.substr(0, kShown);
  MakeValidUtf8(&shown);
  Push(LogEvent(s, "stderr",
                absl::StrCat("[ddp-worker] a line on DDP_EVENTS_FD is not an event (", why,
                             "; docs/command-jobs.md has the format): ", shown,
                             text.size() > kShown ? "..." : "",
                             " (further ones are counted, not shown)")));
}

void OutputPump::Say(const OutputSource& source, std::string text) {
  Stream s{source, Kind::kStderr, -1, LineCutter(0), EventCheck::kStrict, 0};
  MakeValidUtf8(&text);
  Push(LogEvent(s, "stderr", absl::StrCat("[ddp-worker] ", text)));
}

void OutputPump::Closing(Stream& s) {
  if (s.kind != Kind::kEvents || s.check != EventCheck::kLenient || s.malformed < 2) return;
  Push(LogEvent(s, "stderr",
                absl::StrCat("[ddp-worker] ", s.malformed,
                             " lines on DDP_EVENTS_FD in all were not events and were ignored")));
}

void OutputPump::Emit(Stream& s, std::string_view line, int64_t cut_bytes) {
  // Repaired before parsing: the JSON parser may reject or keep invalid bytes.
  std::string text(line);
  MakeValidUtf8(&text);
  if (s.kind == Kind::kEvents && s.check == EventCheck::kLenient) {
    if (cut_bytes > 0) {
      return Malformed(s, text, absl::StrCat("longer than ", kMaxEventLineBytes, " bytes"));
    }
    v1::ReportedEvent ev = Envelope(s);
    std::string why;
    const double now_s = absl::ToDoubleSeconds(clock_->Now() - absl::UnixEpoch());
    switch (ParseProgramEvent(text, s.source.rank, now_s, ev.mutable_event(), &why)) {
      case ProgramLine::kEvent:
        return Push(std::move(ev));
      case ProgramLine::kDropped:
        return;
      case ProgramLine::kMalformed:
        return Malformed(s, text, why);
    }
    return;
  }
  v1::ReportedEvent ev = Envelope(s);
  bool relay = true;
  if (s.kind == Kind::kEvents && cut_bytes == 0) {
    v1::TrainerEvent event;
    std::vector<std::string> problems;
    if (ParseTrainerEvent(text, &event, &problems)) {
      for (const std::string& p : problems) {
        if (logged_problems_.size() < 100 && logged_problems_.insert(p).second) {
          DDP_LOG(WARNING) << "a trainer event does not match the contract (docs/trainer.md): "
                           << p << " (logged once)";
        }
      }
      relay = event.body_case() != v1::TrainerEvent::BODY_NOT_SET;  // Not buckets, trace.
      *ev.mutable_event() = std::move(event);
    }
  }
  if (!relay) return;
  if (!ev.has_event()) {
    if (cut_bytes > 0) absl::StrAppend(&text, " [ddp-worker: line cut, ", cut_bytes, " more bytes]");
    return Push(LogEvent(s, s.kind == Kind::kStderr ? "stderr" : "stdout", std::move(text)));
  }
  Push(std::move(ev));
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
      {
        absl::MutexLock lock(&mu_);
        reading_ = s;
      }
      char buf[65536];
      ssize_t n = ::read(s->fd, buf, sizeof(buf));
      if (n > 0) {
        s->lines.Feed(buf, static_cast<size_t>(n),
                      [&](std::string_view l, int64_t cut) { Emit(*s, l, cut); });
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        s->lines.Flush([&](std::string_view l, int64_t cut) { Emit(*s, l, cut); });
        Closing(*s);
        closed.push_back(s);
      }
      absl::MutexLock lock(&mu_);
      reading_ = nullptr;
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
