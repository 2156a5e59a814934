// The stall watchdog's view of one attempt: when each rank last showed progress, as
// the coordinator saw it (its own clock, so skew between nodes does not matter).
//
// A trainer reports progress through its events (ReportEvents): every rank sends a
// `step` event every metrics.every_steps steps, and `epoch`, `checkpoint` and `done`
// events at their boundaries. The watch is armed by the attempt's first `step`
// event (before it, start-up is covered by the start timeout and the trainers'
// rdzv.timeout_s); from then on every rank has the timeout to report again. A rank
// silent past it has stalled: a SIGSTOPped or hung process, a dead NIC. Its peers
// are then silent too (they wait for it in a collective), so the watch names the
// rank its agent reports stopped, else the one silent longest.
//
// Whom to blame needs care at the edge: the stopped rank may have reported last (its
// peers' last reports were batched a little earlier), so the first rank past the
// timeout is often the healthy one waiting for it. Hence a stall is declared when any
// rank is past the timeout, and then a rank reported stopped is named whatever its
// own silence; with none reported stopped, the watch waits a grace (two heartbeats,
// the time an agent's word takes to arrive) past the timeout before naming the rank
// silent longest.
//
// The timeout: train.stall_timeout_s if set, else 10 times the longest gap seen
// between two progress reports of one rank (so it follows every_steps, epoch-end
// validation and checkpoint saves), at least 30 s, and at most half of
// train.collective_timeout_s, so that the watchdog, which knows whom to blame,
// always fires before the trainers' collective timeout blames a healthy peer.
//
// A user's program (a command job) reports as it likes: maybe from rank 0 only, maybe
// once per epoch. So for a command job a rank is watched only from its second `step`
// line on (it reports, and one gap between its reports has been seen); a rank that
// never reports is never blamed.
//
// Owned by the attempt's JobRecord; reset when an attempt forms. Not persisted: a
// restarted coordinator re-arms it with the next step events.
#ifndef DDP_COORDINATOR_CORE_STALL_WATCHDOG_H_
#define DDP_COORDINATOR_CORE_STALL_WATCHDOG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "ddp/v1/types.pb.h"

namespace ddp {

// A rank's flight recorder as its agent last read it (decision 193): the heartbeat's
// FlightState, and when the coordinator got it (its durations are as of then).
struct RankFlight {
  bool known = false;
  v1::FlightState state;
  absl::Time read_at;
};

// A rank's stacks as its agent summarized them (decision 194).
struct RankStack {
  bool known = false;
  v1::StackSummary summary;
};

class StallWatch {
 public:
  static constexpr absl::Duration kFloor = absl::Seconds(30);
  static constexpr int kGapsPerTimeout = 10;
  // How long a suspected stall waits for the ranks' stacks (with two heartbeats more,
  // the time their agents' word takes) before the watch names a rank without them.
  static constexpr absl::Duration kStackWait = absl::Seconds(3);

  StallWatch() = default;
  // `reporting_ranks_only`: a command job's watch (see the file comment).
  explicit StallWatch(bool reporting_ranks_only) : reporting_ranks_only_(reporting_ranks_only) {}

  // A progress event from `rank` of a `world`-rank attempt (`step`: a step event,
  // which arms the watch; other events count only once it is armed).
  void Progress(int rank, int world, bool step, absl::Time now);
  // The rank finished (its `done` event): never stalled from here on.
  void Done(int rank);
  // What the rank's agent last said of its process: stopped (SIGSTOP, a debugger).
  void SetStopped(int rank, int world, bool stopped);
  // What the rank's agent last read from its flight recorder.
  void SetFlight(int rank, int world, RankFlight flight);
  const std::vector<RankFlight>& flights() const { return flights_; }
  // What the rank's agent last reported of its stacks.
  void SetStack(int rank, int world, v1::StackSummary stack);
  const std::vector<RankStack>& stacks() const { return stacks_; }
  bool armed() const { return !last_.empty(); }

  // The timeout in effect (see the file comment).
  absl::Duration Timeout(double stall_timeout_s, double collective_timeout_s) const;

  struct Stall {
    int rank = -1;
    absl::Duration silent;  // Since its last progress.
    bool stopped = false;   // Its agent reports the process stopped.
    bool lagging = false;   // Its flight recorder shows the others waiting for it.
    bool by_stack = false;  // Its stack is outside any collective, the others' in one.
  };
  // Some watched rank has been silent for `timeout` or longer: a stall, once the watch
  // knows whom to blame (Find).
  bool Suspected(absl::Time now, absl::Duration timeout) const;
  // The stacks taken for the stall suspected now: capture `seq`, waited for until
  // `until`. Cleared (0) when no stall is suspected any more.
  void AskedStacks(int seq, absl::Time until) {
    asked_seq_ = seq;
    asked_until_ = until;
  }
  int asked_seq() const { return asked_seq_; }
  absl::Time asked_until() const { return asked_until_; }
  // Every rank still running has reported its stacks of capture `seq` (or a later one).
  bool StacksIn(int seq) const;
  // The rank the others wait for, by the stacks of capture `seq`: every running rank's
  // are in, some wait in a collective, and this one (the lowest such) is outside any.
  // -1: none such.
  int StackLaggard(int seq) const;
  // The stalled rank, when some rank has been silent for `timeout` or longer: one
  // reported stopped if any is; else the one the flight recorders show the others
  // waiting for (Laggard), at once; else the one the stacks asked for show them waiting
  // for (StackLaggard); else, once the longest silence is past `timeout` +
  // `unreported_grace`, the rank silent longest. O(world).
  std::optional<Stall> Find(absl::Time now, absl::Duration timeout,
                            absl::Duration unreported_grace = absl::ZeroDuration()) const;

  // The rank the others wait for, by the flight recorders: every rank's is known, this
  // one entered fewer collectives than all the others, and some other rank has one in
  // flight (it waits in the collective this rank never entered). -1: none such.
  int Laggard() const;
  // Why `stall.rank` stalled, from the flight recorders, as the attempt's reason goes
  // on after "rank R on W stalled: ...": "; it never entered all-reduce #4817 (bucket 3,
  // 1.2 MB), where ranks 0, 2 have waited 31.0s; rank 1 is in data loading (for 31.4s,
  // step 11)"; then what the stacks asked for show: "; ranks 0, 2 wait in all_reduce
  // (torch/distributed/distributed_c10d.py:1536); rank 1 is outside any collective, in
  // block_forever (train.py:4)", or the rank's own "; its stack: read < ...". Empty
  // when neither is known.
  std::string Explain(const Stall& stall, absl::Time now) const;

 private:
  void Size(int world);
  std::string ExplainFlights(const Stall& stall, absl::Time now) const;
  std::string ExplainStacks(const Stall& stall) const;

  std::vector<absl::Time> last_;  // By rank; empty until armed.
  std::vector<bool> stopped_;     // By rank.
  std::vector<RankFlight> flights_;  // By rank.
  std::vector<RankStack> stacks_;    // By rank.
  int asked_seq_ = 0;
  absl::Time asked_until_ = absl::InfinitePast();
  absl::Duration longest_gap_ = absl::ZeroDuration();
  bool reporting_ranks_only_ = false;
  std::vector<int> steps_;  // By rank, with reporting_ranks_only_: step lines seen (to 2).
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_CORE_STALL_WATCHDOG_H_
