#include "client/collapse.h"

#include "absl/strings/str_cat.h"

namespace ddp {

LineCollapser::LineCollapser(std::map<int, int> world_sizes, absl::Duration window,
                             int64_t max_lag_lines)
    : world_sizes_(std::move(world_sizes)), window_(window), max_lag_lines_(max_lag_lines) {}

std::vector<CollapsedLine> LineCollapser::Add(const v1::LogLine& line, absl::Time now) {
  ++lines_;
  Group* home = nullptr;
  for (Group& g : pending_) {
    if (g.line.attempt == line.attempt() && g.line.stream == line.stream() &&
        g.line.text == line.text() && !g.line.ranks.count(line.rank())) {
      home = &g;
      break;
    }
  }
  if (home == nullptr) {
    pending_.push_back({{line.attempt(), line.stream(), line.text(), {}}, now, lines_});
    home = &pending_.back();
  }
  home->line.ranks.insert(line.rank());
  return Release(now, false);
}

std::vector<CollapsedLine> LineCollapser::Expire(absl::Time now) { return Release(now, false); }

std::vector<CollapsedLine> LineCollapser::Flush() { return Release(absl::InfiniteFuture(), true); }

std::vector<CollapsedLine> LineCollapser::Release(absl::Time now, bool all) {
  std::vector<CollapsedLine> out;
  while (!pending_.empty()) {
    const Group& g = pending_.front();
    auto world = world_sizes_.find(g.line.attempt);
    const bool complete = world != world_sizes_.end() &&
                          static_cast<int>(g.line.ranks.size()) >= world->second;
    const bool expired = now - g.opened >= window_ || lines_ - g.opened_at_line >= max_lag_lines_;
    if (!all && !complete && !expired) break;
    out.push_back(g.line);
    pending_.pop_front();
  }
  return out;
}

std::string FormatRanks(const std::set<int>& ranks) {
  std::string out;
  for (auto it = ranks.begin(); it != ranks.end();) {
    const int first = *it;
    int last = first;
    for (++it; it != ranks.end() && *it == last + 1; ++it) last = *it;
    absl::StrAppend(&out, out.empty() ? "" : ",", first);
    if (last > first) absl::StrAppend(&out, last == first + 1 ? "," : "-", last);
  }
  return out;
}

std::string RenderCollapsedLine(const CollapsedLine& line) {
  return absl::StrCat("[", line.ranks.size() == 1 ? "rank " : "ranks ", FormatRanks(line.ranks),
                      "] ", line.stream == "event" ? "* " : "", line.text);
}

}  // namespace ddp
