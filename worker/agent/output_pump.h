// One thread that reads every trainer's event pipe, stdout and stderr, and turns each
// line into a ReportedEvent in the agent's EventBuffer: JSON event lines become typed
// TrainerEvents (trainer_event_parser.h; the verbose `trace`/`buckets` stay local),
// other lines become LogLines. Never blocks the agent loop; a trainer that floods output
// is bounded by the buffer.
//
// Whatever a trainer prints, what goes into the buffer is well-formed: lines longer
// than kMaxLineBytes are cut (and say so), and every string is valid UTF-8 (invalid
// bytes become U+FFFD), so the coordinator can always parse the batches.
#ifndef DDP_WORKER_AGENT_OUTPUT_PUMP_H_
#define DDP_WORKER_AGENT_OUTPUT_PUMP_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "worker/agent/event_buffer.h"
#include "worker/agent/line_cutter.h"

namespace ddp {

struct OutputSource {
  std::string job_id;
  int attempt = 0;
  int rank = 0;
  bool operator<(const OutputSource& o) const {
    return std::tie(job_id, attempt, rank) < std::tie(o.job_id, o.attempt, o.rank);
  }
};

// Longest output line relayed whole; longer ones keep this much and say how much was
// cut. Event lines (JSON from the trainer) may be longer.
inline constexpr size_t kMaxLineBytes = 16 << 10;
inline constexpr size_t kMaxEventLineBytes = 64 << 10;

// How a rank's event lines are read: ddp-trainer's strictly (contract problems are
// logged; a line that is not an event is output), a user program's leniently
// (ParseProgramEvent: a malformed line is counted and the first one shown in the job's
// log, never fatal).
enum class EventCheck { kStrict, kLenient };

class OutputPump {
 public:
  // `on_push` runs after each push into `out` (the reporter's wake-up), on the
  // pump's thread with no lock held.
  OutputPump(EventBuffer* out, Clock* clock, std::function<void()> on_push = nullptr);
  ~OutputPump();
  OutputPump(const OutputPump&) = delete;
  OutputPump& operator=(const OutputPump&) = delete;

  // Takes ownership of the descriptors (-1 for none).
  void Add(const OutputSource& source, int events_fd, int stdout_fd, int stderr_fd,
           EventCheck check = EventCheck::kStrict);
  // Malformed event lines from users' programs, in all (the agent's metrics).
  int64_t malformed_event_lines() const { return malformed_total_.load(); }
  // True once every pipe of `source` has been read to its end.
  bool Drained(const OutputSource& source);
  // True while some pipe of `source` holds bytes the pump has not read yet, or the
  // pump is turning bytes it read from one of them into events: the pump is behind (a
  // flood), as opposed to a pipe held open by a silent grandchild. (A pipe's last
  // chunk is out of the pipe before its lines are in the buffer; without the second
  // half an exit could be reported ahead of them.)
  bool Unread(const OutputSource& source);
  // Forgets a drained source (its task is gone).
  void Forget(const OutputSource& source);
  // A line of the agent's own in `source`'s log (stderr, "[ddp-worker] " first), from
  // any thread.
  void Say(const OutputSource& source, std::string text);

 private:
  enum class Kind { kEvents, kStdout, kStderr };
  struct Stream {
    OutputSource source;
    Kind kind;
    int fd;
    LineCutter lines;
    EventCheck check = EventCheck::kStrict;
    int64_t malformed = 0;  // Lenient event streams: lines that were not events.
  };
  void Loop();
  void Emit(Stream& stream, std::string_view line, int64_t cut_bytes);
  // A lenient stream's line that is not an event: counted; the first is shown.
  void Malformed(Stream& stream, const std::string& text, const std::string& why);
  // The stream is at its end: a lenient one with malformed lines says how many.
  void Closing(Stream& stream);
  void Push(v1::ReportedEvent ev);
  // An event of `s`'s rank, stamped now, with no payload yet.
  v1::ReportedEvent Envelope(const Stream& s);
  v1::ReportedEvent LogEvent(const Stream& s, const char* stream, std::string text);

  EventBuffer* const out_;
  Clock* const clock_;
  const std::function<void()> on_push_;
  int wake_[2] = {-1, -1};
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
  std::map<OutputSource, int> open_ ABSL_GUARDED_BY(mu_);  // Pipes not yet at EOF.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // The stream whose bytes the loop thread is reading and emitting (set before the
  // read, cleared once its lines are pushed), so Unread() never sees an empty pipe
  // while its last lines are still in the pump's hands.
  const Stream* reading_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t poll_errors_ = 0;  // Loop thread only.
  // Contract problems already logged (each kind once), loop thread only.
  std::set<std::string> logged_problems_;
  std::atomic<int64_t> malformed_total_{0};
  std::thread thread_;
};

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_OUTPUT_PUMP_H_
