#include "client/stragglers.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "client/render.h"
#include "common/jobspec/job_spec.h"

namespace ddp {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double ComputeMs(const v1::RankMetrics& m) { return std::max(0.0, m.step_ms() - m.comm_ms()); }

// The phases a straggler's excess is looked for in (decision 190): what the rank
// measured of its step beside the communication wait.
struct Phase {
  const char* name;
  bool (v1::RankMetrics::*has)() const;
  double (v1::RankMetrics::*ms)() const;
};
constexpr Phase kPhases[] = {
    {"data loading", &v1::RankMetrics::has_data_ms, &v1::RankMetrics::data_ms},
    {"compute", &v1::RankMetrics::has_compute_ms, &v1::RankMetrics::compute_ms},
    {"optimizer", &v1::RankMetrics::has_optimizer_ms, &v1::RankMetrics::optimizer_ms},
};

// The phase in which `m` is slowest against the others' median (by the excess in ms),
// or "" when they do not all measure phases.
std::string SlowPhase(const v1::RankMetrics* m, const std::vector<const v1::RankMetrics*>& all) {
  const char* slowest = nullptr;
  double excess = 0;
  for (const Phase& p : kPhases) {
    std::vector<double> others;
    for (const v1::RankMetrics* n : all) {
      if (!(n->*p.has)()) return "";
      if (n != m) others.push_back((n->*p.ms)());
    }
    const double over = (m->*p.ms)() - Median(others);
    if (slowest == nullptr || over > excess) {
      slowest = p.name;
      excess = over;
    }
  }
  return slowest == nullptr || excess <= 0 ? "" : slowest;
}

}  // namespace

std::map<int, std::string> RankNotes(const v1::Job& job, absl::Time now,
                                     const RankNoteOptions& o) {
  std::map<int, std::string> notes;
  if (job.state() != v1::RUNNING || job.attempts().empty()) return notes;
  const v1::Attempt& attempt = job.attempts(job.attempts_size() - 1);
  std::map<int, const v1::RankAssignment*> live;
  for (const v1::RankAssignment& r : attempt.ranks()) {
    if (!r.exited()) live[r.rank()] = &r;
  }
  std::vector<const v1::RankMetrics*> current;
  for (const v1::RankMetrics& m : job.metrics()) {
    if (m.attempt() == attempt.number() && live.count(m.rank()) && std::isfinite(m.step_ms())) {
      current.push_back(&m);
    }
  }
  // Stragglers need someone to compare with.
  if (current.size() >= 2) {
    for (const v1::RankMetrics* m : current) {
      std::vector<double> others;
      for (const v1::RankMetrics* n : current) {
        if (n != m) others.push_back(ComputeMs(*n));
      }
      const double median = Median(others), mine = ComputeMs(*m);
      if (median > 0 && mine / median >= o.straggler_ratio &&
          mine - median >= o.straggler_min_excess_ms) {
        const std::string phase = SlowPhase(m, current);
        notes[m->rank()] = absl::StrFormat("straggler %.1fx%s", mine / median,
                                           phase.empty() ? "" : " (" + phase + ")");
      }
    }
  }
  // Stale: nothing for many update intervals (metrics every N steps).
  int64_t every_steps = 1;
  if (!job.spec_yaml().empty()) {
    auto spec = ParseJobSpec(job.spec_yaml(), "job.yaml");
    if (spec.ok()) every_steps = std::max<int64_t>(1, spec->metrics.every_steps);
  }
  std::vector<double> steps;
  for (const v1::RankMetrics* m : current) steps.push_back(m->step_ms());
  const double step_ms = steps.empty() ? 0 : Median(steps);
  const absl::Duration limit =
      std::max(o.stale_floor, absl::Milliseconds(step_ms * every_steps * o.stale_intervals));
  for (const v1::RankMetrics* m : current) {
    if (m->update_ms() == 0) continue;
    const absl::Duration age = now - absl::FromUnixMillis(m->update_ms());
    if (age > limit) notes[m->rank()] = "stale " + HumanDuration(age);
  }
  return notes;
}

}  // namespace ddp
