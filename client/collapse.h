// `ddpctl logs --collapse`: folds a line that several ranks printed alike into one
// line with the rank list, "[ranks 0-3] loading data".
//
// The k-th time a rank prints a text joins the oldest pending group with that text
// (same attempt and stream) that lacks the rank. Groups leave in the order they were
// opened, once complete (every rank of the attempt is in) or expired (older than the
// time window, or more than `max_lag_lines` lines behind), so a line that only some
// ranks print is still shown, with the ranks that did.
#ifndef DDP_CLIENT_COLLAPSE_H_
#define DDP_CLIENT_COLLAPSE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "ddp/v1/types.pb.h"

namespace ddp {

struct CollapsedLine {
  int attempt = 0;
  std::string stream;
  std::string text;
  std::set<int> ranks;
};

class LineCollapser {
 public:
  // world_sizes: attempt -> its number of ranks (an attempt not listed never counts
  // as complete and waits for expiry).
  LineCollapser(std::map<int, int> world_sizes, absl::Duration window,
                int64_t max_lag_lines = 1000);

  // Adds a line; returns the groups now ready, oldest first.
  std::vector<CollapsedLine> Add(const v1::LogLine& line, absl::Time now);
  // Groups whose window has passed by `now`.
  std::vector<CollapsedLine> Expire(absl::Time now);
  // Everything still pending (the stream ended).
  std::vector<CollapsedLine> Flush();

 private:
  struct Group {
    CollapsedLine line;
    absl::Time opened;
    int64_t opened_at_line;
  };
  std::vector<CollapsedLine> Release(absl::Time now, bool all);

  std::map<int, int> world_sizes_;
  absl::Duration window_;
  int64_t max_lag_lines_;
  int64_t lines_ = 0;
  std::deque<Group> pending_;
};

// "0-3,5,7-8".
std::string FormatRanks(const std::set<int>& ranks);
// "[ranks 0-3] text" ("[rank 2] text" for one rank; "* " before notable events).
std::string RenderCollapsedLine(const CollapsedLine& line);

}  // namespace ddp

#endif  // DDP_CLIENT_COLLAPSE_H_
