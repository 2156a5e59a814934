// `ddpctl plot`: fetches the job with its metric history and writes an SVG or PNG, or
// draws a Unicode chart on the terminal (client/plot/plot.h has the pure parts).
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <grpcpp/client_context.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/plot/image.h"
#include "client/plot/term_chart.h"
#include "common/rpc/status.h"

namespace ddp {
namespace {

// Written next to the target and renamed over it: a reader never sees half a picture.
absl::Status WriteAtomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out.flush()) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return absl::UnavailableError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

int TerminalWidth() {
  struct winsize ws = {};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 40) return ws.ws_col;
  return 100;
}

}  // namespace

int Plot(CtlContext& ctx, const std::string& job_id, const PlotOptions& options) {
  const std::string& target = options.output;
  const bool svg = absl::EndsWithIgnoreCase(target, ".svg");
  const bool png = absl::EndsWithIgnoreCase(target, ".png");
  if (!svg && !png && target != "table" && target != "json") {
    *ctx.err << "ddpctl plot: -o must name a .svg or .png file, or be table or json (got '"
             << target << "')\n";
    return kCtlUsage;
  }
  if (options.width < 200 || options.height < 200 || options.width > 10000 ||
      options.height > 10000) {
    *ctx.err << "ddpctl plot: --width and --height must be between 200 and 10000 pixels\n";
    return kCtlUsage;
  }
  grpc::ClientContext rpc;
  rpc.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  req.set_metric_history(true);
  v1::Job job;
  absl::Status st = FromGrpcStatus(ctx.stub->GetJob(&rpc, req, &job));
  if (!st.ok()) return ReportError(ctx, st, job_id);
  auto data = plot::ExtractPlotData(job);
  if (!data.ok()) {
    *ctx.err << "ddpctl: " << data.status().message() << "\n";
    return kCtlFailed;
  }
  if (target == "json") {
    *ctx.out << plot::PlotDataJson(*data);
    return kCtlOk;
  }
  if (target == "table") {
    plot::TermChartOptions o;
    o.width = TerminalWidth();
    o.color = ctx.tty;
    *ctx.out << plot::RenderTerminalChart(*data, o);
    return kCtlOk;
  }
  plot::LayoutOptions layout;
  layout.width = options.width;
  layout.height = options.height;
  const plot::Drawing drawing = plot::LayoutPlot(*data, layout);
  auto bytes = plot::RenderImage(drawing, svg ? plot::ImageFormat::kSvg : plot::ImageFormat::kPng);
  if (!bytes.ok()) {
    *ctx.err << "ddpctl: " << bytes.status().message() << "\n";
    return kCtlFailed;
  }
  if (absl::Status w = WriteAtomically(target, *bytes); !w.ok()) {
    *ctx.err << "ddpctl: " << w.message() << ": check the directory exists and is writable\n";
    return kCtlFailed;
  }
  size_t steps = 0;
  for (const auto& r : data->ranks) steps = std::max(steps, r.loss.size());
  *ctx.err << "wrote " << target << " (" << layout.width << "x" << layout.height << ", "
           << data->ranks.size() << " ranks, " << steps << " steps, " << data->epochs.size()
           << " epochs, " << data->restarts.size() << " restarts)\n";
  return kCtlOk;
}

}  // namespace ddp
