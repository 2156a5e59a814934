#include "client/render.h"

#include <string.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/stragglers.h"
#include "common/jobspec/labels.h"

namespace ddp {
namespace {

absl::Time FromMillis(int64_t ms) { return absl::FromUnixMillis(ms); }

// Display width: UTF-8 continuation bytes take no column.
size_t Width(const std::string& s) {
  size_t w = 0;
  for (unsigned char c : s) w += (c & 0xC0) != 0x80;
  return w;
}

std::string Metric(double v, const absl::FormatSpec<double>& fmt) {
  return std::isnan(v) ? "-" : absl::StrFormat(fmt, v);
}

const v1::Attempt* Current(const v1::Job& job) {
  return job.attempts().empty() ? nullptr : &job.attempts(job.attempts_size() - 1);
}

std::string Ago(int64_t ms, absl::Time now) {
  if (ms == 0) return "-";
  absl::Duration d = now - FromMillis(ms);
  if (d < absl::Seconds(10)) return absl::StrFormat("%.1fs ago", absl::ToDoubleSeconds(d));
  return HumanDuration(d) + " ago";
}

std::string Elapsed(const v1::Job& job, absl::Time now) {
  if (job.start_ms() == 0) return "-";
  absl::Time end = job.end_ms() ? FromMillis(job.end_ms()) : now;
  return HumanDuration(end - FromMillis(job.start_ms()));
}

std::string RankState(const v1::RankAssignment& r) {
  if (!r.exited()) {
    if (r.lost()) return "lost";
    return r.pid() ? "running" : "starting";
  }
  if (r.signal()) {
    const char* name = sigabbrev_np(r.signal());
    return name ? absl::StrCat("signal ", r.signal(), " (SIG", name, ")")
                : absl::StrCat("signal ", r.signal());
  }
  return absl::StrCat("exit ", r.exit_code());
}

}  // namespace

const char* StateName(v1::JobState s) {
  return v1::JobState_Name(s).c_str();  // The enum value names, from protoc.
}

std::string FormatTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()));
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], Width(row[i]));
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - Width(row[i]) + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

std::string HumanDuration(absl::Duration d) {
  if (d < absl::ZeroDuration()) d = absl::ZeroDuration();
  int64_t s = absl::ToInt64Seconds(d);
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
}

std::string WithThousands(double value) {
  if (std::isnan(value)) return "-";
  std::string digits = absl::StrFormat("%.0f", std::fabs(value));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return value < 0 ? "-" + out : out;
}

std::string ProgressBar(double fraction, int width) {
  fraction = std::clamp(fraction, 0.0, 1.0);
  const int full = static_cast<int>(std::round(fraction * width));
  std::string bar = "[";
  for (int i = 0; i < width; ++i) bar += i < full ? "█" : "░";
  return absl::StrFormat("%s] %3d%%", bar, static_cast<int>(std::round(fraction * 100)));
}

void ProgressEstimator::Observe(const v1::Job& job, absl::Time now) {
  for (const v1::RankMetrics& m : job.metrics()) {
    if (m.rank() != 0) continue;
    if (last_step_ >= 0 && m.global_step() > last_step_ && now > last_time_) {
      const double rate = (m.global_step() - last_step_) / absl::ToDoubleSeconds(now - last_time_);
      steps_per_s_ = steps_per_s_ == 0 ? rate : 0.7 * steps_per_s_ + 0.3 * rate;
    }
    if (m.global_step() != last_step_) {
      last_step_ = m.global_step();
      last_time_ = now;
    }
  }
}

double ProgressEstimator::Fraction(const v1::Job& job) const {
  if (job.state() == v1::SUCCEEDED) return 1.0;
  for (const v1::RankMetrics& m : job.metrics()) {
    if (m.rank() != 0 || m.steps() <= 0 || job.epochs() <= 0) continue;
    return (static_cast<double>(m.epoch()) + static_cast<double>(m.step() + 1) / m.steps()) /
           static_cast<double>(job.epochs());
  }
  return -1;
}

absl::Duration ProgressEstimator::Eta(const v1::Job& job) const {
  if (steps_per_s_ <= 0) return -absl::Seconds(1);
  for (const v1::RankMetrics& m : job.metrics()) {
    if (m.rank() != 0 || m.steps() <= 0) continue;
    const double left = static_cast<double>((job.epochs() - m.epoch() - 1) * m.steps() +
                                            (m.steps() - m.step() - 1));
    return absl::Seconds(std::max(0.0, left) / steps_per_s_);
  }
  return -absl::Seconds(1);
}

std::vector<std::string> RenderWatch(const v1::Job& job, const ProgressEstimator& progress,
                                     absl::Time now, bool color) {
  auto paint = [&](const std::string& s, const char* code) {
    return color ? absl::StrCat("\x1b[", code, "m", s, "\x1b[0m") : s;
  };
  const char* state_color = job.state() == v1::SUCCEEDED   ? "32"
                            : job.state() == v1::FAILED    ? "31"
                            : job.state() == v1::CANCELLED ? "33"
                                                           : "36";
  std::vector<std::string> lines;
  const v1::Attempt* attempt = Current(job);
  lines.push_back(absl::StrCat(
      "job ", paint(job.id(), "1"), "  ", paint(StateName(job.state()), state_color),
      attempt ? absl::StrCat("  attempt ", attempt->number(), "  world ", attempt->world_size())
              : "",
      "  elapsed ", Elapsed(job, now)));
  if (!job.reason().empty()) lines.push_back(absl::StrCat("  ", job.reason()));

  double total_rate = 0;
  std::map<int, const v1::RankMetrics*> by_rank;
  for (const v1::RankMetrics& m : job.metrics()) {
    by_rank[m.rank()] = &m;
    total_rate += m.samples_per_s();
  }
  const double fraction = progress.Fraction(job);
  if (fraction >= 0 && by_rank.count(0)) {
    const v1::RankMetrics& r0 = *by_rank[0];
    const absl::Duration eta = progress.Eta(job);
    lines.push_back(absl::StrCat("epoch ", std::min<int64_t>(r0.epoch() + 1, job.epochs()), "/",
                                 job.epochs(), " ", ProgressBar(fraction, 30), "  ETA ",
                                 eta < absl::ZeroDuration() ? "-" : HumanDuration(eta), "  ",
                                 WithThousands(total_rate), " samples/s"));
  }
  std::vector<std::vector<std::string>> rows = {
      {"RANK", "WORKER", "STATE", "EPOCH", "STEP", "LOSS", "SAMPLES/S", "STEP MS", "COMM MS",
       "UPDATED"}};
  // GPU ranks get their GPU's columns: memory their tensors hold now (of the most they
  // held) from the trainer, and the GPU's utilization from the worker's NVML.
  bool gpu = false;
  for (const auto& [rank, m] : by_rank) gpu = gpu || m->has_gpu_memory_allocated_mib();
  if (attempt != nullptr) {
    for (const v1::RankAssignment& r : attempt->ranks()) gpu = gpu || r.has_gpu_utilization_pct();
  }
  if (gpu) rows[0].insert(rows[0].end() - 1, {"GPU MEM MIB", "GPU UTIL"});
  // Stragglers and stale ranks get a NOTE column (only while there is something to note).
  const std::map<int, std::string> notes = RankNotes(job, now);
  if (!notes.empty()) rows[0].push_back("NOTE");
  if (attempt != nullptr) {
    for (const v1::RankAssignment& r : attempt->ranks()) {
      auto it = by_rank.find(r.rank());
      const v1::RankMetrics* m = it == by_rank.end() ? nullptr : it->second;
      rows.push_back({absl::StrCat(r.rank()), r.worker(), RankState(r),
                      m ? absl::StrCat(m->epoch()) : "-",
                      m ? absl::StrCat(m->step() + 1, "/", m->steps()) : "-",
                      m ? Metric(m->loss(), "%.4f") : "-",
                      m ? WithThousands(m->samples_per_s()) : "-",
                      m ? Metric(m->step_ms(), "%.1f") : "-",
                      m ? Metric(m->comm_ms(), "%.1f") : "-",
                      m ? Ago(m->update_ms(), now) : "-"});
      if (gpu) {
        std::vector<std::string>& row = rows.back();
        row.insert(row.end() - 1,
                   {m && m->has_gpu_memory_allocated_mib()
                        ? absl::StrFormat("%.0f/%.0f", m->gpu_memory_allocated_mib(),
                                          m->gpu_memory_peak_mib())
                        : "-",
                    r.has_gpu_utilization_pct()
                        ? absl::StrFormat("%.0f%%", r.gpu_utilization_pct())
                        : "-"});
      }
      if (auto n = notes.find(r.rank()); n != notes.end()) rows.back().push_back(n->second);
    }
  }
  std::string table = FormatTable(rows);
  for (absl::string_view l : absl::StrSplit(table, '\n', absl::SkipEmpty())) {
    // Paint the note (the last column) after alignment: escapes take no width.
    size_t cut = absl::string_view::npos;
    for (const char* word : {"straggler ", "stale "}) {
      const size_t at = notes.empty() ? absl::string_view::npos : l.rfind(word);
      if (at != absl::string_view::npos && (cut == absl::string_view::npos || at > cut)) cut = at;
    }
    if (color && cut != absl::string_view::npos) {
      lines.push_back(absl::StrCat(l.substr(0, cut), paint(std::string(l.substr(cut)), "33;1")));
    } else {
      lines.emplace_back(l);
    }
  }
  if (!job.epoch_history().empty()) {
    const v1::EpochSummary& e = job.epoch_history(job.epoch_history_size() - 1);
    lines.push_back(absl::StrCat("last epoch ", e.epoch(), ": train_loss ",
                                 Metric(e.train_loss(), "%.4f"), "  val_loss ",
                                 Metric(e.val_loss(), "%.4f"), "  val_accuracy ",
                                 Metric(e.val_accuracy() * 100, "%.2f%%")));
  }
  return lines;
}

std::vector<std::string> RenderWatchLines(const v1::Job& job, const v1::Job* previous,
                                          absl::Time now) {
  std::vector<std::string> lines;
  const std::string stamp = absl::FormatTime("%H:%M:%S", now, absl::LocalTimeZone());
  if (previous == nullptr || previous->state() != job.state() ||
      previous->reason() != job.reason()) {
    lines.push_back(absl::StrCat(stamp, " job ", job.id(), " ", StateName(job.state()),
                                 job.reason().empty() ? "" : ": " + job.reason()));
  }
  const std::map<int, std::string> notes = RankNotes(job, now);
  std::map<int, int64_t> before;
  if (previous != nullptr) {
    for (const auto& m : previous->metrics()) before[m.rank()] = m.global_step();
  }
  for (const v1::RankMetrics& m : job.metrics()) {
    auto it = before.find(m.rank());
    if (it != before.end() && it->second == m.global_step()) continue;
    lines.push_back(absl::StrFormat(
        "%s rank %d epoch %d step %d/%d loss %s samples/s %s step_ms %s comm_ms %s", stamp,
        m.rank(), m.epoch(), m.step() + 1, m.steps(), Metric(m.loss(), "%.4f"),
        WithThousands(m.samples_per_s()), Metric(m.step_ms(), "%.1f"),
        Metric(m.comm_ms(), "%.1f")));
    if (m.has_data_ms() || m.has_compute_ms() || m.has_optimizer_ms()) {
      absl::StrAppend(&lines.back(), " data_ms ", Metric(m.data_ms(), "%.1f"), " compute_ms ",
                      Metric(m.compute_ms(), "%.1f"), " optimizer_ms ",
                      Metric(m.optimizer_ms(), "%.1f"));
    }
    if (m.has_gpu_memory_allocated_mib()) {
      absl::StrAppendFormat(&lines.back(), " gpu_mem_mib %.0f gpu_peak_mib %.0f",
                            m.gpu_memory_allocated_mib(), m.gpu_memory_peak_mib());
    }
    if (auto n = notes.find(m.rank()); n != notes.end()) absl::StrAppend(&lines.back(), "  ", n->second);
  }
  const int seen = previous ? previous->epoch_history_size() : 0;
  for (int i = seen; i < job.epoch_history_size(); ++i) {
    const v1::EpochSummary& e = job.epoch_history(i);
    lines.push_back(absl::StrCat(stamp, " epoch ", e.epoch(), " train_loss ",
                                 Metric(e.train_loss(), "%.4f"), " val_loss ",
                                 Metric(e.val_loss(), "%.4f"), " val_accuracy ",
                                 Metric(e.val_accuracy(), "%.4f")));
  }
  return lines;
}

std::string LabelCell(const google::protobuf::Map<std::string, std::string>& labels) {
  return labels.empty() ? "-" : FormatLabels(Labels(labels.begin(), labels.end()));
}

std::string RenderJob(const v1::Job& job, absl::Time now) {
  std::vector<std::vector<std::string>> info = {
      {"Job:", job.id()},
      {"Name:", job.name()},
      {"State:", absl::StrCat(StateName(job.state()),
                              job.queue_position() ? absl::StrCat(" (queue position ",
                                                                  job.queue_position(), ")")
                                                   : "")},
      {"Reason:", job.reason()},
      {"Rendezvous id:", job.rdzv_id()},
      {"Nodes:", job.min_nodes() == job.max_nodes()
                     ? absl::StrCat(job.min_nodes())
                     : absl::StrCat(job.min_nodes(), ":", job.max_nodes())},
      {"Procs per node:", job.nproc_per_node() ? absl::StrCat(job.nproc_per_node()) : "auto"},
      {"Restarts:", absl::StrCat(job.restarts(), " of ", job.max_restarts())},
      {"Recoveries:", job.max_recoveries() == 0
                          ? "off (max_recoveries 0)"
                          : absl::StrCat(job.recoveries(), " of ", job.max_recoveries(), " (live)")},
      {"Workdir:", job.workdir().empty() ? "-" : job.workdir()},
      {"Submitted:", Ago(job.submit_ms(), now)},
      {"Owner:", job.owner().empty() ? "- (submitted without authentication)" : job.owner()},
      {"Priority:", absl::StrCat(job.priority(), job.preemptions() > 0
                                                     ? absl::StrCat(" (preempted ", job.preemptions(),
                                                                    " time(s))")
                                                     : "")},
      {"Node selector:", job.node_selector().empty() ? "- (any node)" : LabelCell(job.node_selector())},
      {"Preemption:", job.preemption() == v1::PREEMPT_KILL    ? "kill (at once)"
                      : job.preemption() == v1::PREEMPT_NEVER ? "never"
                                                              : "at its next checkpoint"},
      {"Checkpoint:", job.last_checkpoint_attempt() == 0
                          ? "- (none reported)"
                          : absl::StrCat("global step ", job.last_checkpoint_step(), " (attempt ",
                                         job.last_checkpoint_attempt(), "), ",
                                         Ago(job.last_checkpoint_ms(), now))},
  };
  if (job.has_preemption_loss_ms()) {
    info.push_back(
        {"Preempted now:",
         job.preemption_loss_ms() == 0 && job.preemption() != v1::PREEMPT_KILL
             ? "would lose nothing (moves at its next checkpoint)"
             : absl::StrCat("would lose ",
                            HumanDuration(absl::Milliseconds(job.preemption_loss_ms())),
                            " of training (since the state it would resume from)")});
  }
  info.push_back({"Elapsed:", Elapsed(job, now)});
  std::string out = FormatTable(info);
  for (const v1::Attempt& a : job.attempts()) {
    absl::StrAppend(&out, "\nAttempt ", a.number(), ": ", StateName(a.state()),
                    a.reason().empty() ? "" : " - " + a.reason(), "\n  rendezvous store ",
                    a.master_addr(), ":", a.master_port(), ", world size ", a.world_size(),
                    a.generation() > 0 ? absl::StrCat(", generation ", a.generation()) : "",
                    "\n");
    for (const v1::Recovery& r : a.recoveries()) {
      absl::StrAppend(&out, "  live recovery ", r.generation(), ": ", r.outcome(),
                      r.end_ms() > 0 ? absl::StrCat(" in ", r.end_ms() - r.start_ms(), " ms") : "",
                      r.outcome() == "recovered"
                          ? absl::StrCat(" (state of rank ", r.source_rank(), " at step ",
                                         r.global_step(), ")")
                          : "",
                      " - ", r.cause(), "\n");
    }
    std::vector<std::vector<std::string>> rows = {
        {"  RANK", "LOCAL", "NODE", "WORKER", "ADDRESS", "PID", "STATE", "ERROR"}};
    for (const v1::RankAssignment& r : a.ranks()) {
      rows.push_back({absl::StrCat("  ", r.rank()), absl::StrCat(r.local_rank()),
                      absl::StrCat(r.group_rank()), r.worker(), r.address(),
                      r.pid() ? absl::StrCat(r.pid()) : "-", RankState(r),
                      r.error().empty() ? "" : r.error()});
    }
    out += FormatTable(rows);
  }
  if (!job.metrics().empty()) {
    out += "\nLatest metrics:\n";
    std::vector<std::vector<std::string>> rows = {
        {"  RANK", "EPOCH", "STEP", "LOSS", "SAMPLES/S", "STEP MS", "COMM MS", "UPDATED"}};
    // Where the steps went, when the ranks say (decision 190).
    bool phases = false;
    for (const v1::RankMetrics& m : job.metrics()) phases = phases || m.has_compute_ms();
    if (phases) rows[0].insert(rows[0].end() - 1, {"DATA MS", "COMPUTE MS", "OPTIMIZER MS"});
    for (const v1::RankMetrics& m : job.metrics()) {
      rows.push_back({absl::StrCat("  ", m.rank()), absl::StrCat(m.epoch()),
                      absl::StrCat(m.step() + 1, "/", m.steps()), Metric(m.loss(), "%.4f"),
                      WithThousands(m.samples_per_s()), Metric(m.step_ms(), "%.1f"),
                      Metric(m.comm_ms(), "%.1f"), Ago(m.update_ms(), now)});
      if (phases) {
        auto shown = [&](bool has, double ms) { return has ? Metric(ms, "%.1f") : "-"; };
        rows.back().insert(rows.back().end() - 1,
                           {shown(m.has_data_ms(), m.data_ms()),
                            shown(m.has_compute_ms(), m.compute_ms()),
                            shown(m.has_optimizer_ms(), m.optimizer_ms())});
      }
    }
    out += FormatTable(rows);
  }
  if (!job.epoch_history().empty()) {
    // The newest epochs only: a long job would bury the rest of the page.
    constexpr int kEpochRows = 10;
    const int total = job.epoch_history_size();
    const int first = std::max(0, total - kEpochRows);
    out += first == 0 ? "\nEpochs:\n"
                      : absl::StrCat("\nEpochs (the last ", kEpochRows, " of ", total,
                                     "; all of them: -o json):\n");
    std::vector<std::vector<std::string>> rows = {
        {"  ATTEMPT", "EPOCH", "TRAIN LOSS", "VAL LOSS", "VAL ACCURACY"}};
    for (int i = first; i < total; ++i) {
      const v1::EpochSummary& e = job.epoch_history(i);
      rows.push_back({absl::StrCat("  ", e.attempt()), absl::StrCat(e.epoch()),
                      Metric(e.train_loss(), "%.4f"), Metric(e.val_loss(), "%.4f"),
                      Metric(e.val_accuracy() * 100, "%.2f%%")});
    }
    out += FormatTable(rows);
  }
  return out;
}

std::string RenderDiagnosis(const v1::Job& job, const std::vector<v1::LogLine>& stopped,
                            const std::vector<v1::LogLine>& stacks) {
  if (job.attempts().empty()) {
    return absl::StrCat("Job ", job.id(), ": ", StateName(job.state()),
                        ", no attempt has started: nothing to diagnose\n");
  }
  const v1::Attempt& a = *job.attempts().rbegin();
  std::string out = absl::StrCat("Job ", job.id(), " attempt ", a.number(), ": ",
                                 StateName(a.state()),
                                 a.reason().empty() ? "" : " - " + a.reason(), "\n");
  auto seconds = [](int64_t ms) {
    return absl::StrFormat("%.1fs", static_cast<double>(ms) / 1e3);
  };
  std::vector<std::vector<std::string>> rows = {
      {"RANK", "WORKER", "PID", "STATE", "PHASE", "FOR", "STEP", "ENTERED", "COLLECTIVE",
       "WAITING"}};
  bool any = false, any_stack = false;
  int64_t oldest = 0;
  for (const v1::RankAssignment& r : a.ranks()) any_stack = any_stack || r.has_stack();
  if (any_stack) rows[0].push_back("STACK");
  for (const v1::RankAssignment& r : a.ranks()) {
    std::vector<std::string> row = {absl::StrCat(r.rank()), r.worker(),
                                    r.pid() ? absl::StrCat(r.pid()) : "-", RankState(r)};
    if (r.has_flight()) {
      any = true;
      const v1::FlightState& f = r.flight();
      oldest = std::max(oldest, f.age_ms());
      row.insert(row.end(),
                 {f.phase(), seconds(f.phase_ms()),
                  f.global_step() >= 0 ? absl::StrCat(f.global_step()) : "-",
                  absl::StrCat(f.entered()), f.collective().empty() ? "-" : f.collective(),
                  f.waiting_ms() > 0 ? seconds(f.waiting_ms()) : "-"});
    } else {
      row.insert(row.end(), {"-", "-", "-", "-", "-", "-"});
    }
    if (any_stack) {
      const v1::StackSummary& s = r.stack();
      row.push_back(!r.has_stack()        ? "-"
                    : s.tools().empty()   ? "none taken"
                    : s.in_collective()   ? "in " + s.where()
                                          : s.where().empty() ? "?" : s.where());
    }
    rows.push_back(std::move(row));
  }
  const bool ended =
      a.state() == v1::SUCCEEDED || a.state() == v1::FAILED || a.state() == v1::CANCELLED;
  if (any) {
    out += FormatTable(rows);
    absl::StrAppend(&out, "Flight recorders as their workers read them, at most ",
                    seconds(oldest), " ago.\n");
  } else if (!ended) {
    out += FormatTable(rows);
    out += "No flight recorder has reached the coordinator for this attempt yet (ddp-trainer "
           "and libddp programs keep one; other programs do not).\n";
  }
  if (any_stack) out += "STACK: where each rank's main thread was at its latest stacks.\n";
  if (ended) {
    if (stopped.empty()) {
      out += "No rank looked stuck when its worker stopped it (or none keeps a flight "
             "recorder).\n";
    } else {
      out += "When their workers stopped them:\n";
      for (const v1::LogLine& l : stopped) {
        absl::StrAppend(&out, "  ", absl::StripPrefix(l.text(), "[ddp-worker] "), "\n");
      }
    }
  }
  if (!stacks.empty()) {
    out += "Stacks, as their workers took them:\n";
    for (const v1::LogLine& l : stacks) {
      const std::string text(absl::StripPrefix(l.text(), "[ddp-worker] "));
      absl::StrAppend(&out, "  ", absl::StrReplaceAll(text, {{"\n", "\n  "}}), "\n");
    }
  }
  return out;
}

std::string RenderJobList(const std::vector<v1::Job>& jobs, absl::Time now) {
  std::vector<std::vector<std::string>> rows = {
      {"JOB", "NAME", "STATE", "PRIORITY", "NODES", "WORLD", "RESTARTS", "SUBMITTED",
       "ELAPSED"}};
  for (const v1::Job& j : jobs) {
    const v1::Attempt* a = Current(j);
    rows.push_back({j.id(), j.name(), StateName(j.state()), absl::StrCat(j.priority()),
                    j.min_nodes() == j.max_nodes() ? absl::StrCat(j.min_nodes())
                                                   : absl::StrCat(j.min_nodes(), ":", j.max_nodes()),
                    a ? absl::StrCat(a->world_size()) : "-", absl::StrCat(j.restarts()),
                    Ago(j.submit_ms(), now), Elapsed(j, now)});
  }
  return FormatTable(rows);
}

namespace {

// "cordoned since 2026-11-23 08:01:02 UTC by alice", "draining (after each job's next
// checkpoint) since ...".
std::string DescribeMaintenanceState(const v1::Worker& w) {
  std::string what = "cordoned";
  if (w.maintenance() == v1::WORKER_DRAINING) {
    what = w.jobs().empty() ? "drained"
           : w.drain_policy() == v1::DRAIN_WAIT ? "draining (its jobs run to their end)"
           : w.drain_policy() == v1::DRAIN_NOW  ? "draining (its jobs restart elsewhere now)"
                                                : "draining (each job moves after its next checkpoint)";
  }
  if (w.maintenance_since_ms() > 0) {
    absl::StrAppend(&what, " since ",
                    absl::FormatTime("%Y-%m-%d %H:%M:%S UTC",
                                     absl::FromUnixMillis(w.maintenance_since_ms()),
                                     absl::UTCTimeZone()));
  }
  if (!w.maintenance_by().empty()) absl::StrAppend(&what, " by ", w.maintenance_by());
  return what;
}

}  // namespace

std::string RenderWorkers(const std::vector<v1::Worker>& workers, absl::Time now) {
  std::vector<std::vector<std::string>> rows = {
      {"WORKER", "STATE", "ADDRESS", "SLOTS", "FREE", "GPUS", "LABELS", "LAST HEARTBEAT",
       "VERSION", "JOBS"}};
  std::vector<std::vector<std::string>> gpus = {
      {"WORKER", "GPU", "MODEL", "MEMORY", "USED", "UTIL", "UUID", "JOB", "RANK"}};
  std::string quarantines;  // One line per quarantined worker, with its reason.
  std::string maintenance;  // One line per cordoned or draining worker.
  for (const v1::Worker& w : workers) {
    const bool quarantined = w.alive() && w.quarantined_until_ms() != 0;
    if (quarantined) {
      const int64_t left_s =
          std::max<int64_t>(0, (w.quarantined_until_ms() - absl::ToUnixMillis(now) + 999) / 1000);
      absl::StrAppend(&quarantines, w.name(), " is quarantined for another ", left_s,
                      "s: ", w.quarantine_reason(), "\n");
    }
    int free_gpus = 0;
    for (const v1::GpuDevice& g : w.gpu_devices()) {
      free_gpus += g.job_id().empty() ? 1 : 0;
      gpus.push_back({w.name(), absl::StrCat(g.index()), g.model(),
                      absl::StrFormat("%.0f GiB", static_cast<double>(g.memory_bytes()) / (1 << 30)),
                      g.has_memory_used_bytes()
                          ? absl::StrFormat("%.1f GiB",
                                            static_cast<double>(g.memory_used_bytes()) / (1 << 30))
                          : "-",
                      g.has_utilization_percent() ? absl::StrCat(g.utilization_percent(), "%") : "-",
                      g.uuid(), g.job_id().empty() ? "-" : g.job_id(),
                      g.job_id().empty() ? "-" : absl::StrCat(g.rank())});
    }
    // GPUS: free/total where the coordinator reports the devices, else the count.
    const std::string gpu_cell = w.gpu_devices().empty()
                                     ? absl::StrCat(w.gpus())
                                     : absl::StrCat(w.alive() ? free_gpus : 0, "/", w.gpus());
    if (w.maintenance() != v1::WORKER_SCHEDULABLE) {
      absl::StrAppend(&maintenance, w.name(), " is ", DescribeMaintenanceState(w), "\n");
    }
    rows.push_back({w.name(), WorkerState(w), w.address(), absl::StrCat(w.slots()),
                    absl::StrCat(w.free_slots()), gpu_cell, LabelCell(w.labels()),
                    Ago(w.last_heartbeat_ms(), now),
                    w.version().empty() ? "-" : w.version(),
                    w.jobs().empty() ? "-" : absl::StrJoin(w.jobs(), ",")});
  }
  std::string out = FormatTable(rows);
  if (!quarantines.empty()) out += "\n" + quarantines;
  if (!maintenance.empty()) out += "\n" + maintenance;
  if (gpus.size() > 1) out += "\n" + FormatTable(gpus);
  return out;
}

std::string WorkerState(const v1::Worker& w) {
  std::string state = !w.alive() ? "lost" : w.quarantined_until_ms() != 0 ? "quarantined" : "alive";
  switch (w.maintenance()) {
    case v1::WORKER_CORDONED: return state + ",cordoned";
    case v1::WORKER_DRAINING: return state + (w.jobs().empty() ? ",drained" : ",draining");
    default: return state;
  }
}

std::string DescribeMaintenance(const v1::Worker& w) {
  const std::string on_it = w.jobs().empty()
                                ? std::string("no jobs run on it")
                                : absl::StrCat("its jobs (", absl::StrJoin(w.jobs(), ", "), ")");
  switch (w.maintenance()) {
    case v1::WORKER_CORDONED:
      return absl::StrCat("worker ", w.name(), " cordoned: it takes no new ranks",
                          w.jobs().empty() ? "" : absl::StrCat("; ", on_it, " keep running"));
    case v1::WORKER_DRAINING:
      if (w.jobs().empty()) {
        return absl::StrCat("worker ", w.name(), " drained: it takes no new ranks and ",
                            on_it, "; stop its ddp-worker when you like");
      }
      switch (w.drain_policy()) {
        case v1::DRAIN_WAIT:
          return absl::StrCat("worker ", w.name(), " draining: it takes no new ranks; ", on_it,
                              " run to their end there (watch with `ddpctl workers`)");
        case v1::DRAIN_NOW:
          return absl::StrCat("worker ", w.name(), " draining: ", on_it,
                              " restart on other workers from their last checkpoint");
        default:
          return absl::StrCat("worker ", w.name(), " draining: ", on_it,
                              " move to other workers after their next checkpoint (one "
                              "without periodic checkpoints runs to its end there)");
      }
    default:
      return absl::StrCat("worker ", w.name(), " uncordoned: it takes new ranks again");
  }
}

std::string RenderWorkerSummary(const v1::WorkerSummary& s) {
  return absl::StrCat(WithThousands(s.workers()), " workers: ", WithThousands(s.alive()),
                      " alive, ", WithThousands(s.lost()), " lost; ", WithThousands(s.slots()),
                      " slots, ", WithThousands(s.free_slots()), " free; ",
                      WithThousands(s.busy_workers()), " busy",
                      s.cordoned() > 0 ? absl::StrCat("; ", WithThousands(s.cordoned()),
                                                      " cordoned or draining")
                                       : "");
}

std::vector<std::string> WorkerVersionWarnings(const std::vector<v1::Worker>& workers,
                                               const std::string& coordinator_version) {
  std::vector<std::string> out;
  if (coordinator_version.empty()) return out;  // An older coordinator: nothing to compare.
  // One line per version, naming a few of its workers: 10,000 agents of another build
  // are one warning, not 10,000.
  std::map<std::string, std::vector<std::string>> by_version;
  for (const v1::Worker& w : workers) {
    if (w.version().empty() || w.version() == coordinator_version) continue;
    by_version[w.version()].push_back(w.name());
  }
  constexpr size_t kNamed = 5;
  for (const auto& [version, names] : by_version) {
    std::string who;
    if (names.size() == 1) {
      who = absl::StrCat("worker ", names[0], " runs");
    } else {
      const std::vector<std::string> some(names.begin(),
                                          names.begin() + std::min(kNamed, names.size()));
      who = absl::StrCat(WithThousands(static_cast<double>(names.size())), " workers (",
                         absl::StrJoin(some, ", "),
                         names.size() > kNamed
                             ? absl::StrCat(" and ",
                                            WithThousands(static_cast<double>(names.size() - kNamed)),
                                            " more")
                             : "",
                         ") run");
    }
    out.push_back(absl::StrCat("warning: ", who, " ddp ", version, ", the coordinator ",
                               coordinator_version, ": upgrade them to one version"));
  }
  return out;
}

std::string RenderLogLine(const v1::LogLine& line, bool with_rank) {
  std::string prefix = with_rank ? absl::StrCat("[rank ", line.rank(), "] ") : "";
  if (line.stream() == "event") prefix += "* ";
  return prefix + line.text();
}

}  // namespace ddp
