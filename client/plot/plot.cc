#include "client/plot/plot.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json_writer.h"

namespace ddp::plot {
namespace {

constexpr Color kInk{40, 40, 40};
constexpr Color kGrid{225, 225, 225};
constexpr Color kRestart{90, 90, 90};
constexpr Color kTrainLossEpoch{127, 127, 127};
constexpr Color kValLoss{0, 0, 0};
constexpr Color kValAccuracy{188, 189, 34};

bool Finite(double v) { return std::isfinite(v); }

// Maps data coordinates into a panel's pixel box.
struct Frame {
  double left, top, width, height;
  double x0, x1, y0, y1;
  Point Map(double x, double y) const {
    const double fx = x1 > x0 ? (x - x0) / (x1 - x0) : 0.5;
    const double fy = y1 > y0 ? (y - y0) / (y1 - y0) : 0.5;
    return {left + fx * width, top + (1 - fy) * height};
  }
};

// A data range with a little headroom, never empty.
void Range(const std::vector<double>& values, double* lo, double* hi, bool from_zero) {
  double a = std::numeric_limits<double>::infinity(), b = -a;
  for (double v : values) {
    if (!Finite(v)) continue;
    a = std::min(a, v);
    b = std::max(b, v);
  }
  if (!Finite(a)) a = 0, b = 1;
  if (from_zero && a > 0) a = 0;
  if (b - a < 1e-12) {
    const double pad = std::max(std::fabs(a) * 0.1, 1e-3);
    a -= pad, b += pad;
  } else {
    b += (b - a) * 0.05;
    if (!from_zero) a -= (b - a) * 0.05;
  }
  *lo = a, *hi = b;
}

// Axes, grid, tick labels and the panel's title.
void DrawFrame(Drawing& d, const Frame& f, const std::string& title, const std::string& x_label,
               bool right_axis_percent) {
  for (double t : NiceTicks(f.y0, f.y1, 5)) {
    const Point p = f.Map(f.x0, t);
    d.polylines.push_back({{{f.left, p.y}, {f.left + f.width, p.y}}, kGrid, 1, false, "grid"});
    d.texts.push_back({{f.left - 6, p.y + 4}, TickLabel(t), kInk, 11, Anchor::kEnd});
  }
  for (double t : NiceTicks(f.x0, f.x1, 8)) {
    const Point p = f.Map(t, f.y0);
    d.polylines.push_back({{{p.x, f.top}, {p.x, f.top + f.height}}, kGrid, 1, false, "grid"});
    d.texts.push_back({{p.x, f.top + f.height + 15}, TickLabel(t), kInk, 11, Anchor::kMiddle});
  }
  if (right_axis_percent) {
    for (int pct = 0; pct <= 100; pct += 25) {
      const double y = f.top + (1 - pct / 100.0) * f.height;
      d.texts.push_back({{f.left + f.width + 6, y + 4}, absl::StrCat(pct, "%"), kValAccuracy, 11,
                         Anchor::kStart});
    }
  }
  d.polylines.push_back({{{f.left, f.top},
                          {f.left, f.top + f.height},
                          {f.left + f.width, f.top + f.height}},
                         kInk, 1, false, "axis"});
  d.texts.push_back({{f.left, f.top - 8}, title, kInk, 13, Anchor::kStart});
  d.texts.push_back(
      {{f.left + f.width, f.top + f.height + 30}, x_label, kInk, 11, Anchor::kEnd});
}

void DrawRestarts(Drawing& d, const Frame& f, const std::vector<Restart>& restarts,
                  bool by_epoch) {
  for (const Restart& r : restarts) {
    const double x = by_epoch ? r.epoch : r.step;
    if (x < 0) continue;
    const Point p = f.Map(x, f.y1);
    d.polylines.push_back(
        {{{p.x, f.top}, {p.x, f.top + f.height}}, kRestart, 1.5, true, "restart"});
    d.texts.push_back(
        {{p.x + 4, f.top + 12}, absl::StrCat("attempt ", r.attempt), kRestart, 11, Anchor::kStart});
  }
}

Polyline Line(const Frame& f, const std::vector<XY>& pts, Color color, double width,
              std::string cls, int rank) {
  Polyline p{{}, color, width, false, std::move(cls), rank};
  for (const XY& xy : pts) {
    if (Finite(xy.y)) p.points.push_back(f.Map(xy.x, xy.y));
  }
  return p;
}

}  // namespace

absl::StatusOr<PlotData> ExtractPlotData(const v1::Job& job) {
  if (job.history().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job.id(), " has no step metrics yet (state ", v1::JobState_Name(job.state()),
        "): plot it once its trainers have reported steps"));
  }
  PlotData data;
  // rank -> global step -> the newest attempt's metrics.
  std::map<int, std::map<int64_t, const v1::RankMetrics*>> by_rank;
  std::map<int, int64_t> first_step;  // attempt -> its first global step
  for (const v1::RankMetrics& m : job.history()) {
    const v1::RankMetrics*& slot = by_rank[m.rank()][m.global_step()];
    if (slot == nullptr || m.attempt() >= slot->attempt()) slot = &m;
    auto [it, inserted] = first_step.emplace(m.attempt(), m.global_step());
    if (!inserted) it->second = std::min(it->second, m.global_step());
  }
  for (const auto& [rank, steps] : by_rank) {
    RankSeries s;
    s.rank = rank;
    for (const auto& [step, m] : steps) {
      s.loss.push_back({static_cast<double>(step), m->loss()});
      s.throughput.push_back({static_cast<double>(step), m->samples_per_s()});
    }
    data.ranks.push_back(std::move(s));
  }
  std::map<int64_t, const v1::EpochSummary*> epochs;
  std::map<int, int64_t> first_epoch;
  for (const v1::EpochSummary& e : job.epoch_history()) {
    const v1::EpochSummary*& slot = epochs[e.epoch()];
    if (slot == nullptr || e.attempt() >= slot->attempt()) slot = &e;
    auto [it, inserted] = first_epoch.emplace(e.attempt(), e.epoch());
    if (!inserted) it->second = std::min(it->second, e.epoch());
  }
  for (const auto& [epoch, e] : epochs) {
    data.epochs.push_back({epoch, e->attempt(), e->train_loss(), e->val_loss(), e->val_accuracy()});
  }
  // Every attempt after the first one with data marks a restart.
  std::map<int, Restart> restarts;
  for (const auto& [attempt, step] : first_step) restarts[attempt].step = static_cast<double>(step);
  for (const auto& [attempt, epoch] : first_epoch) {
    restarts[attempt].epoch = static_cast<double>(epoch);
  }
  for (auto& [attempt, r] : restarts) {
    if (attempt == restarts.begin()->first) continue;
    r.attempt = attempt;
    data.restarts.push_back(r);
  }
  data.title = absl::StrCat(job.id(), job.name().empty() ? "" : " (" + job.name() + ")", "  ",
                            v1::JobState_Name(job.state()), "  ", job.attempts_size(),
                            job.attempts_size() == 1 ? " attempt" : " attempts");
  return data;
}

std::vector<XY> Decimate(const std::vector<XY>& series, size_t max_points) {
  if (max_points == 0 || series.size() <= max_points) return series;
  std::vector<XY> out;
  out.reserve(max_points);
  const double per = static_cast<double>(series.size()) / static_cast<double>(max_points);
  for (size_t b = 0; b < max_points; ++b) {
    const size_t lo = static_cast<size_t>(std::floor(b * per));
    const size_t hi = std::min(series.size(), static_cast<size_t>(std::floor((b + 1) * per)));
    XY sum;
    size_t n = 0;
    for (size_t i = lo; i < hi; ++i) {
      sum.x += series[i].x;
      sum.y += series[i].y;
      ++n;
    }
    if (n > 0) out.push_back({sum.x / n, sum.y / n});
  }
  return out;
}

std::vector<double> NiceTicks(double lo, double hi, int count) {
  std::vector<double> out;
  if (!(hi > lo) || count < 1) return out;
  const double raw = (hi - lo) / count;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) {
    out.push_back(std::fabs(t) < step * 1e-9 ? 0.0 : t);
  }
  return out;
}

std::string TickLabel(double v) {
  const double a = std::fabs(v);
  if (a >= 1e6) return absl::StrFormat("%.3gM", v / 1e6);
  if (a >= 1e4) return absl::StrFormat("%.3gk", v / 1e3);
  return absl::StrFormat("%.4g", v);
}

Drawing LayoutPlot(const PlotData& data, const LayoutOptions& options) {
  Drawing d;
  d.width = options.width;
  d.height = options.height;
  const double left = 70, right = 60, top = 56, gap = 58, bottom = 40;
  const double inner_w = d.width - left - right;
  const double inner_h = d.height - top - bottom - 2 * gap;
  const double heights[3] = {inner_h * 0.4, inner_h * 0.3, inner_h * 0.3};

  d.texts.push_back({{left, 24}, data.title, kInk, 15, Anchor::kStart});
  // Legend: one swatch per rank, right-aligned on the title's line.
  double lx = d.width - right;
  for (auto it = data.ranks.rbegin(); it != data.ranks.rend(); ++it) {
    const std::string label = absl::StrCat("rank ", it->rank);
    lx -= 8.0 * label.size() + 30;
    d.polylines.push_back({{{lx, 20}, {lx + 18, 20}}, RankColor(it->rank), 3, false,
                           absl::StrCat("legend rank-", it->rank), it->rank});
    d.texts.push_back({{lx + 22, 24}, label, kInk, 11, Anchor::kStart});
  }

  std::vector<double> steps, losses, rates;
  for (const RankSeries& s : data.ranks) {
    for (const XY& p : s.loss) steps.push_back(p.x), losses.push_back(p.y);
    for (const XY& p : s.throughput) rates.push_back(p.y);
  }
  double x0, x1;
  Range(steps, &x0, &x1, /*from_zero=*/true);
  if (!steps.empty()) x1 = *std::max_element(steps.begin(), steps.end());
  if (x1 <= x0) x1 = x0 + 1;

  double y = top;
  {  // Training loss.
    Frame f{left, y, inner_w, heights[0], x0, x1, 0, 1};
    Range(losses, &f.y0, &f.y1, /*from_zero=*/false);
    DrawFrame(d, f, "training loss per rank", "global step", false);
    DrawRestarts(d, f, data.restarts, false);
    for (const RankSeries& s : data.ranks) {
      d.polylines.push_back(Line(f, Decimate(s.loss, options.max_points), RankColor(s.rank),
                                 1.5, absl::StrCat("loss rank-", s.rank), s.rank));
    }
    y += heights[0] + gap;
  }
  {  // Throughput.
    Frame f{left, y, inner_w, heights[1], x0, x1, 0, 1};
    Range(rates, &f.y0, &f.y1, /*from_zero=*/true);
    DrawFrame(d, f, "samples/s per rank", "global step", false);
    DrawRestarts(d, f, data.restarts, false);
    for (const RankSeries& s : data.ranks) {
      d.polylines.push_back(Line(f, Decimate(s.throughput, options.max_points),
                                 RankColor(s.rank), 1.5,
                                 absl::StrCat("throughput rank-", s.rank), s.rank));
    }
    y += heights[1] + gap;
  }
  {  // Per epoch: losses on the left axis, accuracy (0..100%) on the right.
    std::vector<XY> train, val, acc;
    std::vector<double> ep, ls;
    bool any_acc = false;
    for (const EpochPoint& e : data.epochs) {
      const double x = static_cast<double>(e.epoch);
      ep.push_back(x);
      train.push_back({x, e.train_loss});
      val.push_back({x, e.val_loss});
      acc.push_back({x, e.val_accuracy});
      ls.push_back(e.train_loss);
      ls.push_back(e.val_loss);
      any_acc |= Finite(e.val_accuracy);
    }
    Frame f{left, y, inner_w, heights[2], 0, 1, 0, 1};
    Range(ep, &f.x0, &f.x1, /*from_zero=*/true);
    if (!ep.empty()) f.x1 = std::max(ep.back(), f.x0 + 1);
    Range(ls, &f.y0, &f.y1, /*from_zero=*/false);
    DrawFrame(d, f,
              data.epochs.empty() ? "per epoch (no epoch has ended yet)"
                                  : "per epoch: train loss (grey, dashed), val loss (black), "
                                    "val accuracy (olive, right axis)",
              "epoch", any_acc);
    DrawRestarts(d, f, data.restarts, true);
    Polyline t = Line(f, train, kTrainLossEpoch, 1.5, "train-loss", -1);
    t.dashed = true;
    d.polylines.push_back(std::move(t));
    d.polylines.push_back(Line(f, val, kValLoss, 2, "val-loss", -1));
    if (any_acc) {
      Frame fa = f;
      fa.y0 = 0, fa.y1 = 1;
      d.polylines.push_back(Line(fa, acc, kValAccuracy, 2, "val-accuracy", -1));
    }
  }
  return d;
}

std::string PlotDataJson(const PlotData& data) {
  auto series = [](const std::vector<XY>& pts) {
    std::vector<std::string> items;
    for (const XY& p : pts) items.push_back(absl::StrCat("[", JsonNumber(p.x), ",", JsonNumber(p.y), "]"));
    return JsonArray(items);
  };
  std::vector<std::string> ranks, epochs, restarts;
  for (const RankSeries& s : data.ranks) {
    ranks.push_back(JsonObject()
                        .Add("rank", s.rank)
                        .AddRaw("loss", series(s.loss))
                        .AddRaw("samples_per_s", series(s.throughput))
                        .str());
  }
  for (const EpochPoint& e : data.epochs) {
    epochs.push_back(JsonObject()
                         .Add("epoch", e.epoch)
                         .Add("attempt", e.attempt)
                         .Add("train_loss", e.train_loss)
                         .Add("val_loss", e.val_loss)
                         .Add("val_accuracy", e.val_accuracy)
                         .str());
  }
  for (const Restart& r : data.restarts) {
    JsonObject o;
    o.Add("attempt", r.attempt);
    if (r.step >= 0) o.Add("global_step", static_cast<int64_t>(r.step));
    if (r.epoch >= 0) o.Add("epoch", static_cast<int64_t>(r.epoch));
    restarts.push_back(o.str());
  }
  return JsonObject()
             .Add("title", data.title)
             .AddRaw("ranks", JsonArray(ranks))
             .AddRaw("epochs", JsonArray(epochs))
             .AddRaw("restarts", JsonArray(restarts))
             .str() +
         "\n";
}

}  // namespace ddp::plot
