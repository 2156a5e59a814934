// `ddpctl plot`: a job's training curves. Two pure steps, each tested on its own:
//
//   v1::Job (GetJob with metric_history) ──ExtractPlotData──▶ PlotData (series)
//   PlotData ──LayoutPlot──▶ Drawing ──RenderImage (image.h, cairo)──▶ PNG or SVG
//   PlotData ──RenderTerminalChart (term_chart.h)──▶ Unicode text
//
// Restarted attempts resume from a checkpoint and redo the steps after it, so a
// rank's history can hold the same global step twice; the plot keeps the later
// attempt's value (the run the model actually went on with) and marks where each
// attempt took over.
#ifndef DDP_CLIENT_PLOT_PLOT_H_
#define DDP_CLIENT_PLOT_PLOT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/plot/drawing.h"
#include "ddp/v1/types.pb.h"

namespace ddp::plot {

struct XY {
  double x = 0, y = 0;
};

struct RankSeries {
  int rank = 0;
  std::vector<XY> loss;        // x: global step.
  std::vector<XY> throughput;  // samples/s, x: global step.
};

// One epoch's summary; NaN where the job has no validation.
struct EpochPoint {
  int64_t epoch = 0;
  int attempt = 0;
  double train_loss = 0, val_loss = 0, val_accuracy = 0;
};

// Where attempt `attempt` (2, 3, ...) took over: its first stored global step and
// its first epoch summary (-1 when it has none).
struct Restart {
  int attempt = 0;
  double step = -1;
  double epoch = -1;
};

struct PlotData {
  std::string title;                // "cancer-ddp-3yxyd (cancer-ddp) SUCCEEDED, 2 attempts"
  std::vector<RankSeries> ranks;    // By rank.
  std::vector<EpochPoint> epochs;   // By epoch.
  std::vector<Restart> restarts;
};

// FAILED_PRECONDITION when the job has no stored step metrics yet (or was fetched
// without metric_history).
absl::StatusOr<PlotData> ExtractPlotData(const v1::Job& job);

// At most `max_points` points, averaging runs of neighbours: a long job's history has
// far more steps than a picture has pixels. Shorter series are returned unchanged.
std::vector<XY> Decimate(const std::vector<XY>& series, size_t max_points);

struct LayoutOptions {
  int width = 960;
  int height = 720;
  size_t max_points = 2000;  // Per series (see Decimate).
};

// Three panels: training loss per rank over global steps, samples/s per rank over
// global steps (both with restart markers), and per epoch the training loss, the
// validation loss and the validation accuracy (right axis). Polylines are classed
// "loss rank-N", "throughput rank-N", "train-loss", "val-loss", "val-accuracy",
// "restart", "axis" and "grid".
Drawing LayoutPlot(const PlotData& data, const LayoutOptions& options = {});

// Ticks for an axis over [lo, hi]: about `count` round values (1, 2 or 5 times a
// power of ten) inside the range.
std::vector<double> NiceTicks(double lo, double hi, int count);
// "12.5k", "0.031", "250": short tick labels.
std::string TickLabel(double v);

// PlotData as JSON (`ddpctl plot JOB -o json`).
std::string PlotDataJson(const PlotData& data);

}  // namespace ddp::plot

#endif  // DDP_CLIENT_PLOT_PLOT_H_
