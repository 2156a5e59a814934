#include "coordinator/core/stall_watchdog.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/contract/flight_recorder.h"

namespace ddp {

void StallWatch::Size(int world) {
  if (world <= 0) return;
  if (static_cast<int>(stopped_.size()) < world) stopped_.resize(static_cast<size_t>(world), false);
  if (static_cast<int>(flights_.size()) < world) flights_.resize(static_cast<size_t>(world));
  if (static_cast<int>(stacks_.size()) < world) stacks_.resize(static_cast<size_t>(world));
}

void StallWatch::SetStack(int rank, int world, v1::StackSummary stack) {
  if (rank < 0 || rank >= world) return;
  Size(world);
  stacks_[static_cast<size_t>(rank)] = {true, std::move(stack)};
}

bool StallWatch::Suspected(absl::Time now, absl::Duration timeout) const {
  for (size_t r = 0; r < last_.size(); ++r) {
    if (reporting_ranks_only_ && steps_[r] < 2) continue;
    if (last_[r] == absl::InfiniteFuture()) continue;  // Done.
    if (now - last_[r] >= timeout) return true;
  }
  return false;
}

bool StallWatch::StacksIn(int seq) const {
  if (last_.empty() || seq <= 0) return false;
  for (size_t r = 0; r < last_.size(); ++r) {
    if (last_[r] == absl::InfiniteFuture()) continue;  // Done.
    if (r >= stacks_.size() || !stacks_[r].known || stacks_[r].summary.seq() < seq) return false;
  }
  return true;
}

int StallWatch::StackLaggard(int seq) const {
  if (!StacksIn(seq)) return -1;
  int outside = -1;
  bool someone_waits = false;
  for (size_t r = 0; r < last_.size(); ++r) {
    if (last_[r] == absl::InfiniteFuture()) continue;
    const v1::StackSummary& s = stacks_[r].summary;
    if (s.tools().empty()) return -1;  // No stack taken: no evidence either way.
    if (s.in_collective()) {
      someone_waits = true;
    } else if (outside < 0) {
      outside = static_cast<int>(r);
    }
  }
  return someone_waits ? outside : -1;
}

void StallWatch::SetFlight(int rank, int world, RankFlight flight) {
  if (rank < 0 || rank >= world) return;
  Size(world);
  flights_[static_cast<size_t>(rank)] = std::move(flight);
}

int StallWatch::Laggard() const {
  if (flights_.empty()) return -1;
  int low = -1;
  bool unique = true, someone_waits = false;
  for (size_t r = 0; r < flights_.size(); ++r) {
    const RankFlight& f = flights_[r];
    if (!f.known) return -1;
    if (r < last_.size() && last_[r] == absl::InfiniteFuture()) return -1;  // Done.
    if (low < 0 || f.state.entered() < flights_[static_cast<size_t>(low)].state.entered()) {
      low = static_cast<int>(r);
      unique = true;
    } else if (f.state.entered() == flights_[static_cast<size_t>(low)].state.entered()) {
      unique = false;
    }
  }
  if (low < 0 || !unique) return -1;
  const uint64_t behind = flights_[static_cast<size_t>(low)].state.entered();
  for (const RankFlight& f : flights_) {
    if (f.state.entered() > behind && f.state.waiting_ms() > 0) someone_waits = true;
  }
  return someone_waits ? low : -1;
}

namespace {

std::string Seconds(int64_t ms) { return absl::StrFormat("%.1fs", static_cast<double>(ms) / 1e3); }

// The flight's ms figures as of `now` (they were read at `read_at`).
int64_t Aged(int64_t ms, const RankFlight& f, absl::Time now) {
  return ms + std::max<int64_t>(0, absl::ToInt64Milliseconds(now - f.read_at));
}

std::string Where(int rank, const RankFlight& f, absl::Time now) {
  std::string out =
      absl::StrCat("rank ", rank, " is in ", flight::PhaseNameOfLabel(f.state.phase()), " (for ",
                   Seconds(Aged(f.state.phase_ms(), f, now)));
  if (f.state.global_step() >= 0) absl::StrAppend(&out, ", step ", f.state.global_step());
  return out + ")";
}

}  // namespace

std::string StallWatch::Explain(const Stall& stall, absl::Time now) const {
  return ExplainFlights(stall, now) + ExplainStacks(stall);
}

std::string StallWatch::ExplainStacks(const Stall& stall) const {
  if (asked_seq_ <= 0 || stall.rank < 0 || static_cast<size_t>(stall.rank) >= stacks_.size()) {
    return "";
  }
  const RankStack& me = stacks_[static_cast<size_t>(stall.rank)];
  if (!me.known || me.summary.seq() < asked_seq_ || me.summary.tools().empty()) return "";
  if (!stall.by_stack) {
    return me.summary.where().empty() ? "" : absl::StrCat("; its stack: ", me.summary.where());
  }
  // The others in a collective, by where they wait (most often one place).
  std::vector<int> waiting;
  std::string where;
  for (size_t r = 0; r < stacks_.size(); ++r) {
    const RankStack& s = stacks_[r];
    if (static_cast<int>(r) == stall.rank || !s.known || !s.summary.in_collective()) continue;
    waiting.push_back(static_cast<int>(r));
    if (where.empty()) where = s.summary.where();
  }
  std::string out = absl::StrCat("; rank", waiting.size() > 1 ? "s " : " ",
                                 absl::StrJoin(waiting, ", "), waiting.size() > 1 ? " wait" : " waits",
                                 " in ", where.empty() ? "a collective" : where, "; rank ",
                                 stall.rank, " is outside any collective");
  if (!me.summary.where().empty()) absl::StrAppend(&out, ", in ", me.summary.where());
  return out + " (their stacks)";
}

std::string StallWatch::ExplainFlights(const Stall& stall, absl::Time now) const {
  if (stall.rank < 0 || static_cast<size_t>(stall.rank) >= flights_.size()) return "";
  const RankFlight& me = flights_[static_cast<size_t>(stall.rank)];
  if (!me.known) return "";
  // Those waiting in a collective this rank never entered, and the longest wait.
  std::vector<int> waiting;
  int64_t waited = 0;
  std::string collective;
  bool all_in_same = me.state.waiting_ms() > 0;
  for (size_t r = 0; r < flights_.size(); ++r) {
    const RankFlight& f = flights_[r];
    if (static_cast<int>(r) == stall.rank) continue;
    if (!f.known || f.state.entered() != me.state.entered() || f.state.waiting_ms() == 0) {
      all_in_same = false;
    }
    if (!f.known) continue;
    if (f.state.entered() <= me.state.entered() || f.state.waiting_ms() == 0) continue;
    waiting.push_back(static_cast<int>(r));
    const int64_t w = Aged(f.state.waiting_ms(), f, now);
    if (w >= waited) {
      waited = w;
      collective = f.state.collective();
    }
  }
  std::string out;
  if (!waiting.empty()) {
    absl::StrAppend(&out, "; it never entered ", collective, ", where rank",
                    waiting.size() > 1 ? "s " : " ", absl::StrJoin(waiting, ", "),
                    waiting.size() > 1 ? " have" : " has", " waited ", Seconds(waited), "; ");
  } else if (all_in_same && flights_.size() > 1) {
    absl::StrAppend(&out, "; every rank is in ", me.state.collective(),
                    ", which has not completed for ", Seconds(Aged(me.state.waiting_ms(), me, now)),
                    " (the network or the backend, not a rank); ");
  } else if (me.state.waiting_ms() > 0) {
    absl::StrAppend(&out, "; it waits in ", me.state.collective(), " (for ",
                    Seconds(Aged(me.state.waiting_ms(), me, now)), "); ");
  } else {
    out = "; ";
  }
  return out + Where(stall.rank, me, now);
}

void StallWatch::Progress(int rank, int world, bool step, absl::Time now) {
  if (rank < 0 || rank >= world) return;
  if (last_.empty()) {
    if (!step) return;
    // Armed: from now on every rank has the timeout to report (again).
    last_.assign(static_cast<size_t>(world), now);
    if (reporting_ranks_only_) steps_.assign(static_cast<size_t>(world), 0);
    Size(world);
  }
  if (rank >= static_cast<int>(last_.size())) return;
  if (reporting_ranks_only_ && step && steps_[static_cast<size_t>(rank)] < 2) {
    ++steps_[static_cast<size_t>(rank)];
  }
  absl::Time& last = last_[static_cast<size_t>(rank)];
  if (last == absl::InfiniteFuture()) return;  // Done.
  longest_gap_ = std::max(longest_gap_, now - last);
  last = now;
}

void StallWatch::Done(int rank) {
  if (rank >= 0 && rank < static_cast<int>(last_.size())) {
    last_[static_cast<size_t>(rank)] = absl::InfiniteFuture();
  }
}

void StallWatch::SetStopped(int rank, int world, bool stopped) {
  if (rank < 0 || rank >= world) return;
  Size(world);
  stopped_[static_cast<size_t>(rank)] = stopped;
}

absl::Duration StallWatch::Timeout(double stall_timeout_s, double collective_timeout_s) const {
  if (stall_timeout_s > 0) return absl::Seconds(stall_timeout_s);
  const absl::Duration learned = std::max(kFloor, kGapsPerTimeout * longest_gap_);
  return std::min(learned, absl::Seconds(collective_timeout_s) / 2);
}

std::optional<StallWatch::Stall> StallWatch::Find(absl::Time now, absl::Duration timeout,
                                                  absl::Duration unreported_grace) const {
  if (last_.empty()) return std::nullopt;
  std::optional<Stall> oldest, stopped;
  for (size_t r = 0; r < last_.size(); ++r) {
    if (reporting_ranks_only_ && steps_[r] < 2) continue;
    if (last_[r] == absl::InfiniteFuture()) continue;  // Done.
    const Stall s{static_cast<int>(r), now - last_[r], r < stopped_.size() && stopped_[r]};
    if (s.stopped && (!stopped.has_value() || s.silent > stopped->silent)) stopped = s;
    if (!oldest.has_value() || s.silent > oldest->silent) oldest = s;
  }
  if (!oldest.has_value() || oldest->silent < timeout) return std::nullopt;  // No stall.
  // The cause, though it may have reported after the peers that wait for it.
  if (stopped.has_value()) return stopped;
  if (const int laggard = Laggard(); laggard >= 0) {  // The others wait for it, by their recorders.
    const size_t r = static_cast<size_t>(laggard);
    return Stall{laggard, now - (last_[r] == absl::InfiniteFuture() ? now : last_[r]), false,
                 true};
  }
  if (asked_seq_ > 0) {
    if (const int s = StackLaggard(asked_seq_); s >= 0) {
      const size_t r = static_cast<size_t>(s);
      return Stall{s, now - last_[r], false, false, true};
    }
  }
  if (oldest->silent < timeout + unreported_grace) return std::nullopt;  // Its agent's word?
  return oldest;
}

}  // namespace ddp
