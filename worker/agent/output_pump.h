// One thread that reads every trainer's event pipe, stdout and stderr, and turns each
// line into a ReportedEvent in the agent's EventBuffer: JSON event lines become typed
// TrainerEvents (design.md's types; the verbose `trace`/`buckets` stay local), other
// lines become LogLines. Never blocks the agent loop; a trainer that floods output
// is bounded by the buffer.
#ifndef DDP_WORKER_AGENT_OUTPUT_PUMP_H_
#define DDP_WORKER_AGENT_OUTPUT_PUMP_H_

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/process.h"
#include "worker/agent/event_buffer.h"

namespace ddp {

struct OutputSource {
  std::string job_id;
  int attempt = 0;
  int rank = 0;
  bool operator<(const OutputSource& o) const {
    return std::tie(job_id, attempt, rank) < std::tie(o.job_id, o.attempt, o.rank);
  }
};

// Parses one line from a trainer's event pipe; false if it is not a JSON event.
bool ParseTrainerEvent(const std::string& line, v1::TrainerEvent* event);

class OutputPump {
 public:
  OutputPump(EventBuffer* out, Clock* clock);
  ~OutputPump();
  OutputPump(const OutputPump&) = delete;
  OutputPump& operator=(const OutputPump&) = delete;

  // Takes ownership of the descriptors (-1 for none).
  void Add(const OutputSource& source, int events_fd, int stdout_fd, int stderr_fd);
  // True once every pipe of `source` has been read to its end.
  bool Drained(const OutputSource& source);
  // Forgets a drained source (its task is gone).
  void Forget(const OutputSource& source);

 private:
  enum class Kind { kEvents, kStdout, kStderr };
  struct Stream {
    OutputSource source;
    Kind kind;
    int fd;
    LineSplitter splitter;
  };
  void Loop();
  void Emit(const Stream& stream, const std::string& line);

  EventBuffer* const out_;
  Clock* const clock_;
  int wake_[2] = {-1, -1};
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
  std::map<OutputSource, int> open_ ABSL_GUARDED_BY(mu_);  // Pipes not yet at EOF.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t poll_errors_ = 0;  // Loop thread only.
  std::thread thread_;
};

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_OUTPUT_PUMP_H_
