// Runs real ddp-trainer processes as one local job, for tests and benchmarks.
//
// TrainerGroup::Start spawns WORLD_SIZE ranks with torchrun's environment (a fresh
// MASTER_PORT on 127.0.0.1) and each rank's events on fd 3; Wait() pumps every
// rank's event and stderr pipes until all ranks exit, handing each event to an
// optional callback that can kill the job (to simulate a crash at a chosen point).
#ifndef DDP_TESTS_TRAINER_TRAINER_HARNESS_H_
#define DDP_TESTS_TRAINER_TRAINER_HARNESS_H_

#include <signal.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/process.h"
#include "google/protobuf/struct.pb.h"
#include "tests/common/test_util.h"

namespace ddp::testing {

// One parsed event line.
struct Event {
  google::protobuf::Struct fields;
  std::string type() const { return String("type"); }
  bool Has(const std::string& key) const;
  double Number(const std::string& key) const;  // NaN when absent or not a number.
  std::string String(const std::string& key) const;
};

struct RankResult {
  int rank = 0;
  ExitStatus exit;
  std::vector<Event> events;
  std::string stderr_text;
  std::vector<Event> OfType(const std::string& type) const;
};

struct TrainerLaunch {
  std::string spec_path;
  // The program each rank runs instead of `ddp-trainer --spec spec_path` (a libddp
  // program, say); it gets the same environment.
  std::vector<std::string> command;
  int world_size = 2;
  std::string cwd;  // Empty: the spec's directory.
  std::map<std::string, std::string> env;
  int master_port = 0;  // 0: pick a free one.
  std::vector<int> ranks;  // Which ranks to start; empty: all of them.
  // Ranks per node; 0: all on one node. Node g gets GROUP_RANK=g, its ranks
  // LOCAL_RANK = rank % nproc_per_node, and DDP_NODE = nodes[g] when given.
  int nproc_per_node = 0;
  std::vector<std::string> nodes;
};

inline TrainerLaunch LaunchOf(std::string spec_path, int world_size) {
  TrainerLaunch launch;
  launch.spec_path = std::move(spec_path);
  launch.world_size = world_size;
  return launch;
}

class TrainerGroup {
 public:
  static absl::StatusOr<std::unique_ptr<TrainerGroup>> Start(const TrainerLaunch& launch);

  // Pumps events until every rank has exited (or `timeout`, after which all are
  // killed). `on_event(rank, event)` or `on_stderr(rank, line)` returning true
  // SIGKILLs every rank.
  std::vector<RankResult> Wait(
      const std::function<bool(int, const Event&)>& on_event = nullptr,
      absl::Duration timeout = absl::Minutes(5),
      const std::function<bool(int, const std::string&)>& on_stderr = nullptr);
  int master_port() const { return port_; }
  // SIGKILLs one rank (e.g. from Wait's callback, to simulate a crashed peer).
  void Kill(int rank) { Signal(rank, SIGKILL); }
  // Sends `signal` to one rank (SIGSTOP: a hung peer).
  void Signal(int rank, int signal);

 private:
  struct Rank {
    int rank;
    std::unique_ptr<Subprocess> proc;
    RankResult result;
  };
  std::vector<Rank> ranks_;
  int port_ = 0;
};

// Runs a job to the end; a shorthand for Start + Wait.
absl::StatusOr<std::vector<RankResult>> RunTrainers(const TrainerLaunch& launch);

// Paths the build gives the tests.
std::string TrainerBinary();
std::string SourceDir();
// Parses a JSON document (fixtures) into a protobuf Value.
absl::StatusOr<google::protobuf::Value> ParseJson(const std::string& text);

}  // namespace ddp::testing

#endif  // DDP_TESTS_TRAINER_TRAINER_HARNESS_H_
