#include "client/commands.h"

#include <grpc/grpc.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/synchronization/mutex.h"
#include "client/collapse.h"
#include "client/reconnect.h"
#include "client/render.h"
#include "client/sanitize.h"
#include "common/jobspec/job_spec.h"
#include "common/json_writer.h"
#include "common/rpc/leader.h"
#include "common/rpc/status.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace ddp {
namespace {

constexpr absl::Duration kUnaryDeadline = absl::Seconds(15);

void SetDeadline(grpc::ClientContext& ctx) {
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kUnaryDeadline));
}

std::string ToJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  std::string s;
  (void)google::protobuf::util::MessageToJsonString(m, &s, o);
  return s;
}

int OutcomeCode(v1::JobState s) {
  switch (s) {
    case v1::SUCCEEDED: return kCtlOk;
    case v1::CANCELLED: return kCtlCancelled;
    default: return kCtlFailed;
  }
}

}  // namespace

absl::StatusOr<v1::Job> FetchJob(CtlContext& ctx, const std::string& job_id, bool history) {
  grpc::ClientContext rpc;
  SetDeadline(rpc);
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  req.set_metric_history(history);
  v1::Job job;
  absl::Status st = FromGrpcStatus(ctx.stub->GetJob(&rpc, req, &job));
  if (!st.ok()) return st;
  SanitizeMessage(&job);
  return job;
}

CtlContext MakeContext(const std::string& coordinator, bool json, bool tty, std::ostream* out,
                       std::ostream* err) {
  return *MakeSecureContext(coordinator, ChannelSecurity(), json, tty, out, err);
}

absl::StatusOr<CtlContext> MakeSecureContext(const std::string& coordinator,
                                             const ChannelSecurity& security, bool json,
                                             bool tty, std::ostream* out, std::ostream* err) {
  CtlContext ctx;
  ctx.coordinator = coordinator;
  ctx.tls = !security.ca_file.empty();
  ctx.json = json;
  ctx.tty = tty;
  ctx.out = out;
  ctx.err = err;
  grpc::ChannelArguments args;
  // `get --history` of a long job carries every stored step: far beyond gRPC's 4 MB
  // default.
  args.SetMaxReceiveMessageSize(-1);
  // Reconnect promptly once a restarted coordinator is back (gRPC's default backoff
  // grows to two minutes).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  auto addresses = ParseCoordinatorList(coordinator);
  if (!addresses.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--coordinator: ", addresses.status().message()));
  }
  for (const std::string& address : *addresses) {
    auto channel = MakeChannel(address, security, args);
    if (!channel.ok()) return channel.status();
    ctx.coordinators.push_back(address);
    ctx.channels.push_back(*channel);
  }
  ctx.coordinator = ctx.coordinators.front();
  ctx.stub = v1::JobService::NewStub(ctx.channels.front());
  FollowLeader(ctx);
  return ctx;
}

void FollowLeader(CtlContext& ctx) {
  if (ctx.coordinators.size() < 2) return;
  size_t at = 0;
  for (size_t i = 0; i < ctx.coordinators.size(); ++i) {
    if (ctx.coordinators[i] == ctx.coordinator) at = i;
  }
  // Any answer but UNAVAILABLE (gone, or "not the leader") or a deadline (paused) is
  // the leader's: an empty job id is refused by it without a lookup.
  for (size_t tries = 0; tries < 2 * ctx.coordinators.size(); ++tries) {
    auto stub = v1::JobService::NewStub(ctx.channels[at]);
    grpc::ClientContext rpc;
    rpc.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    v1::Job job;
    const absl::Status st = FromGrpcStatus(stub->GetJob(&rpc, v1::GetJobRequest(), &job));
    if (!absl::IsUnavailable(st) && !absl::IsDeadlineExceeded(st)) {
      ctx.coordinator = ctx.coordinators[at];
      ctx.stub = std::move(stub);
      return;
    }
    at = NextCoordinator(ctx.coordinators, at, st);
  }
}

int ReportError(CtlContext& ctx, const absl::Status& status, const std::string& job_id) {
  std::ostream& err = *ctx.err;
  // The message may quote what a worker or trainer said.
  const absl::Status st(status.code(), SanitizeText(status.message()));
  switch (st.code()) {
    case absl::StatusCode::kUnavailable:
      // The coordinator answered, but its state directory would not take the change.
      if (absl::StrContains(st.message(), "the coordinator could not store")) {
        err << "ddpctl: " << st.message() << "\n";
        return kCtlFailed;
      }
      if (IsNotLeader(st)) {
        err << "ddpctl: the coordinator at " << ctx.coordinator << " answered: " << st.message()
            << (ctx.coordinators.size() < 2
                    ? " (give --coordinator every coordinator's address, comma-separated, and "
                      "ddpctl finds the leader)"
                    : "")
            << "\n";
        return kCtlFailed;
      }
      if (ctx.tls && (absl::StrContains(st.message(), "SSL") ||
                      absl::StrContains(st.message(), "andshake") ||
                      absl::StrContains(st.message(), "certificate"))) {
        err << "ddpctl: the TLS handshake with " << ctx.coordinator
            << " failed: is --tls-ca (DDP_TLS_CA) the CA that signed the coordinator's "
               "certificate, and does the certificate name the host you connect to? ("
            << st.message() << ")\n";
        return kCtlFailed;
      }
      err << "ddpctl: no coordinator at " << ctx.coordinator
          << ": is ddp-coordinator running? (set --coordinator or DDP_COORDINATOR"
          << (ctx.tls ? "" : "; if it serves TLS, pass its CA with --tls-ca or DDP_TLS_CA")
          << ")\n";
      return kCtlFailed;
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      err << "ddpctl: " << (st.code() == absl::StatusCode::kUnauthenticated
                                ? "not authenticated: "
                                : "permission denied: ")
          << st.message() << "\n";
      return kCtlFailed;
    case absl::StatusCode::kDeadlineExceeded:
      err << "ddpctl: the coordinator at " << ctx.coordinator
          << " did not answer in time: is it overloaded or partitioned?\n";
      return kCtlFailed;
    case absl::StatusCode::kNotFound:
      err << "ddpctl: " << st.message()
          << (job_id.empty() ? "" : ": `ddpctl list` shows the jobs the coordinator knows") << "\n";
      return kCtlFailed;
    case absl::StatusCode::kInvalidArgument:
      err << "ddpctl: invalid job:\n" << st.message() << "\n";
      return kCtlUsage;
    default:
      err << "ddpctl: " << st.message() << "\n";
      return kCtlFailed;
  }
}

int ReportLost(CtlContext& ctx, const absl::Status& status) {
  *ctx.err << "ddpctl: lost the coordinator at " << ctx.coordinator << ": no answer for "
           << absl::FormatDuration(ctx.reconnect_for) << " (" << status.message()
           << "); the job itself carries on: `ddpctl get` shows it once the coordinator is back\n";
  return kCtlLost;
}

int Submit(CtlContext& ctx, const std::string& path, bool watch) {
  std::ifstream in(path);
  if (!in) {
    *ctx.err << "ddpctl: cannot read " << path << "\n";
    return kCtlUsage;
  }
  // Refuse an oversized file before reading it: it would be refused anyway.
  std::error_code size_error;
  const uintmax_t size = std::filesystem::file_size(path, size_error);
  if (!size_error && size > kMaxSpecBytes) {
    *ctx.err << "ddpctl: " << path << " is " << size << " bytes; a job file may have at most "
             << kMaxSpecBytes << " (the spec size limit)\n";
    return kCtlUsage;
  }
  std::stringstream text;
  text << in.rdbuf();
  // Validate here first: a bad file never reaches the coordinator's queue.
  auto spec = ParseJobSpec(text.str(), path);
  if (!spec.ok()) {
    *ctx.err << "ddpctl: " << path << " is not a valid job:\n" << spec.status().message() << "\n";
    return kCtlUsage;
  }
  v1::SubmitJobRequest req;
  req.set_spec_yaml(text.str());
  req.set_source_name(path);
  if (spec->workdir.empty()) {
    // Relative paths in the job resolve against the job file's directory.
    req.set_workdir(std::filesystem::absolute(path).parent_path().lexically_normal().string());
  }
  grpc::ClientContext rpc;
  SetDeadline(rpc);
  v1::SubmitJobResponse resp;
  absl::Status st = FromGrpcStatus(ctx.stub->SubmitJob(&rpc, req, &resp));
  if (!st.ok()) return ReportError(ctx, st);
  SanitizeMessage(&resp);
  if (ctx.json) {
    *ctx.out << ToJson(resp.job()) << "\n";
  } else {
    *ctx.out << resp.job_id() << "\n";
    *ctx.err << "submitted " << resp.job_id() << " (" << StateName(resp.job().state())
             << (resp.job().queue_position() ? absl::StrCat(", queue position ",
                                                            resp.job().queue_position())
                                             : "")
             << ")\n";
  }
  ctx.out->flush();
  return watch ? Watch(ctx, resp.job_id()) : kCtlOk;
}

int Watch(CtlContext& ctx, const std::string& job_id) {
  v1::WatchJobRequest req;
  req.set_job_id(job_id);

  // A reader thread keeps the newest update, reopening the stream if the coordinator
  // goes away once it has answered (each new stream starts with the full state); the
  // main thread draws, and on a terminal also redraws every second so "updated ...
  // ago" and ETA stay current.
  absl::Mutex mu;
  v1::Job latest;
  bool have = false, done = false, fresh = false;
  absl::Status end;  // How the last stream ended.
  Reconnector reconnect(ctx.err, ctx.reconnect_for);
  std::thread pump([&] {
    while (true) {
      grpc::ClientContext rpc;
      auto reader = ctx.stub->WatchJob(&rpc, req);
      v1::Job job;
      while (reader->Read(&job)) {
        reconnect.Connected();
        SanitizeMessage(&job);
        absl::MutexLock lock(&mu);
        latest = job;
        have = fresh = true;
      }
      absl::Status st = FromGrpcStatus(reader->Finish());
      bool reached;
      {
        absl::MutexLock lock(&mu);
        reached = have;
      }
      if (st.ok() || !reached || !reconnect.Retry(st)) {
        absl::MutexLock lock(&mu);
        end = st;
        done = true;
        return;
      }
      FollowLeader(ctx);  // Another coordinator may lead now.
    }
  });

  ProgressEstimator progress;
  size_t drawn = 0;
  v1::Job previous;
  bool has_previous = false;
  auto draw = [&](const v1::Job& job) {
    const absl::Time now = absl::Now();
    if (ctx.json) {
      *ctx.out << ToJson(job) << "\n";
    } else if (ctx.tty) {
      std::vector<std::string> lines = RenderWatch(job, progress, now, /*color=*/true);
      std::string frame;
      if (drawn > 0) frame += absl::StrCat("\x1b[", drawn, "A");  // Back to the top.
      for (const std::string& l : lines) frame += "\x1b[2K" + l + "\n";
      frame += "\x1b[J";  // Clear what a longer previous frame left below.
      *ctx.out << frame;
      drawn = lines.size();
    } else {
      for (const std::string& l : RenderWatchLines(job, has_previous ? &previous : nullptr, now)) {
        *ctx.out << l << "\n";
      }
      previous = job;
      has_previous = true;
    }
    ctx.out->flush();
  };

  bool finished = false;
  while (!finished) {
    v1::Job job;
    bool draw_now = false;
    {
      absl::MutexLock lock(&mu);
      auto ready = [&] { return fresh || done; };
      mu.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
      finished = done;
      if (have && (fresh || (ctx.tty && !ctx.json))) {
        job = latest;
        draw_now = true;
        if (fresh) progress.Observe(latest, absl::Now());
        fresh = false;
      }
    }
    if (draw_now) draw(job);
  }
  pump.join();
  if (reconnect.lost()) return ReportLost(ctx, end);
  if (!end.ok()) return ReportError(ctx, end, job_id);
  if (!have) return kCtlFailed;
  if (!ctx.json) {
    *ctx.err << "job " << latest.id() << " " << StateName(latest.state())
             << (latest.reason().empty() ? "" : ": " + latest.reason()) << "\n";
  }
  return OutcomeCode(latest.state());
}

int Get(CtlContext& ctx, const std::string& job_id, bool history) {
  auto job = FetchJob(ctx, job_id, history);
  if (!job.ok()) return ReportError(ctx, job.status(), job_id);
  *ctx.out << (ctx.json ? ToJson(*job) + "\n" : RenderJob(*job, absl::Now()));
  return kCtlOk;
}

namespace {

// "[ddp-worker] rank 1's stacks (capture 2, ...": the capture's number, else 0.
int StackCapture(const std::string& text) {
  if (!absl::StartsWith(text, "[ddp-worker] rank ")) return 0;
  const size_t at = text.find("'s stacks (capture ");
  if (at == std::string::npos) return 0;
  int seq = 0;
  const absl::string_view rest = absl::string_view(text).substr(at + 19);
  return absl::SimpleAtoi(rest.substr(0, rest.find(',')), &seq) ? seq : 0;
}

// What the workers logged of the ranks of `attempt` (decisions 193 and 194), oldest
// first: their flight recorders when they stopped them, and each rank's latest stacks
// (of capture `seq` or later; 0: any).
struct WorkerNotes {
  std::vector<v1::LogLine> stopped;
  std::vector<v1::LogLine> stacks;
};
absl::StatusOr<WorkerNotes> ReadWorkerNotes(CtlContext& ctx, const std::string& job_id,
                                            int attempt, int seq) {
  v1::StreamLogsRequest req;
  req.set_job_id(job_id);
  grpc::ClientContext rpc;
  SetDeadline(rpc);
  auto reader = ctx.stub->StreamLogs(&rpc, req);
  WorkerNotes out;
  std::map<int, v1::LogLine> latest;  // By rank.
  v1::LogBatch batch;
  while (reader->Read(&batch)) {
    SanitizeMessage(&batch);
    for (v1::LogLine& l : *batch.mutable_lines()) {
      if (l.attempt() != attempt || !absl::StartsWith(l.text(), "[ddp-worker] rank ")) continue;
      if (absl::StrContains(l.text(), "flight recorder when stopped")) {
        out.stopped.push_back(std::move(l));
      } else if (const int c = StackCapture(l.text()); c > 0 && c >= seq) {
        auto it = latest.find(l.rank());
        if (it == latest.end() || StackCapture(it->second.text()) <= c) latest[l.rank()] = l;
      }
    }
  }
  DDP_RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
  for (auto& [rank, line] : latest) out.stacks.push_back(std::move(line));
  return out;
}

// --now: asks for the stacks and waits (up to 30 s) until every running rank's summary
// and log line of that capture have reached the coordinator. The job's view then.
absl::StatusOr<v1::Job> CaptureNow(CtlContext& ctx, const std::string& job_id, int* seq,
                                   WorkerNotes* notes) {
  v1::CaptureStacksRequest req;
  req.set_job_id(job_id);
  v1::CaptureStacksResponse resp;
  {
    grpc::ClientContext rpc;
    SetDeadline(rpc);
    DDP_RETURN_IF_ERROR(FromGrpcStatus(ctx.stub->CaptureStacks(&rpc, req, &resp)));
  }
  *seq = resp.seq();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (true) {
    DDP_ASSIGN_OR_RETURN(v1::Job job, FetchJob(ctx, job_id, /*history=*/false));
    if (job.attempts().empty()) return job;
    const v1::Attempt& a = *job.attempts().rbegin();
    if (a.number() != resp.attempt() || a.state() != v1::RUNNING) return job;  // It ended.
    size_t running = 0, taken = 0;
    for (const v1::RankAssignment& r : a.ranks()) {
      if (r.exited() || r.lost()) continue;
      ++running;
      if (r.stack().seq() >= resp.seq()) ++taken;
    }
    if (taken == running) {
      DDP_ASSIGN_OR_RETURN(*notes, ReadWorkerNotes(ctx, job_id, a.number(), resp.seq()));
      if (notes->stacks.size() >= running || absl::Now() >= deadline) return job;
    } else if (absl::Now() >= deadline) {
      DDP_ASSIGN_OR_RETURN(*notes, ReadWorkerNotes(ctx, job_id, a.number(), resp.seq()));
      return job;
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
}

}  // namespace

int Diagnose(CtlContext& ctx, const std::string& job_id, bool now) {
  WorkerNotes notes;
  int seq = 0;
  auto job = now ? CaptureNow(ctx, job_id, &seq, &notes) : FetchJob(ctx, job_id, false);
  if (!job.ok()) return ReportError(ctx, job.status(), job_id);
  if (job->attempts().empty()) {
    *ctx.out << (ctx.json ? std::string("{}\n") : RenderDiagnosis(*job, {}, {}));
    return kCtlOk;
  }
  const v1::Attempt& a = *job->attempts().rbegin();
  const bool ended =
      a.state() == v1::SUCCEEDED || a.state() == v1::FAILED || a.state() == v1::CANCELLED;
  // Without --now: what the workers logged (the stacks a stall took, what they saw of
  // the ranks they stopped), for a running attempt too.
  if (!now || ended) {
    auto read = ReadWorkerNotes(ctx, job_id, a.number(), 0);
    if (!read.ok()) return ReportError(ctx, read.status(), job_id);
    notes = *std::move(read);
  }
  if (ctx.json) {
    JsonObject o;
    o.AddRaw("attempt", ToJson(a));
    std::vector<std::string> texts;
    for (const v1::LogLine& l : notes.stopped) texts.push_back(ToJson(l));
    o.AddRaw("stopped", JsonArray(texts));
    texts.clear();
    for (const v1::LogLine& l : notes.stacks) texts.push_back(ToJson(l));
    o.AddRaw("stacks", JsonArray(texts));
    *ctx.out << o.str() << "\n";
  } else {
    *ctx.out << RenderDiagnosis(*job, notes.stopped, notes.stacks);
  }
  return kCtlOk;
}

int List(CtlContext& ctx, int limit) {
  grpc::ClientContext rpc;
  SetDeadline(rpc);
  v1::ListJobsRequest req;
  req.set_limit(limit);
  v1::ListJobsResponse resp;
  absl::Status st = FromGrpcStatus(ctx.stub->ListJobs(&rpc, req, &resp));
  if (!st.ok()) return ReportError(ctx, st);
  SanitizeMessage(&resp);
  if (ctx.json) {
    *ctx.out << ToJson(resp) << "\n";
  } else {
    *ctx.out << RenderJobList({resp.jobs().begin(), resp.jobs().end()}, absl::Now());
  }
  return kCtlOk;
}

int Cancel(CtlContext& ctx, const std::string& job_id, bool wait) {
  grpc::ClientContext rpc;
  SetDeadline(rpc);
  v1::CancelJobRequest req;
  req.set_job_id(job_id);
  v1::Job job;
  absl::Status st = FromGrpcStatus(ctx.stub->CancelJob(&rpc, req, &job));
  if (!st.ok()) return ReportError(ctx, st, job_id);
  SanitizeMessage(&job);
  // Wait until the workers report every trainer gone, including those handed out but
  // not yet started (they have no pid yet).
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  auto stopped = [](const v1::Job& j) {
    for (const v1::Attempt& a : j.attempts()) {
      if (a.live_trainers() > 0) return false;
    }
    return true;
  };
  while (wait && !stopped(job) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(200));
    auto fresh = FetchJob(ctx, job_id, false);
    if (!fresh.ok()) return ReportError(ctx, fresh.status(), job_id);
    job = *std::move(fresh);
  }
  if (ctx.json) {
    *ctx.out << ToJson(job) << "\n";
  } else {
    *ctx.out << "job " << job_id << " cancelled"
             << (wait ? (stopped(job) ? "; its trainers have stopped"
                                      : "; some trainers have not reported stopping yet")
                      : "")
             << "\n";
  }
  return kCtlOk;
}

int Logs(CtlContext& ctx, const std::string& job_id, bool follow, int rank, int tail,
         bool collapse) {
  v1::StreamLogsRequest req;
  req.set_job_id(job_id);
  req.set_follow(follow);
  req.set_tail(tail);
  if (rank >= 0) {
    req.set_has_rank(true);
    req.set_rank(rank);
  }
  std::map<int, int> world_sizes;  // attempt -> ranks, for --collapse
  if (follow || collapse) {
    // Reached once, the coordinator is worth waiting for if it goes away.
    auto job = FetchJob(ctx, job_id, false);
    if (!job.ok()) return ReportError(ctx, job.status(), job_id);
    for (const v1::Attempt& a : job->attempts()) world_sizes[a.number()] = a.world_size();
  }
  // A line that only some ranks print waits at most this long for the others.
  LineCollapser collapser(world_sizes, absl::Seconds(1));
  auto print = [&](const std::vector<CollapsedLine>& ready) {
    for (const CollapsedLine& c : ready) {
      if (ctx.json) {
        JsonObject o;
        o.Add("attempt", c.attempt).Add("stream", c.stream).Add("text", c.text);
        std::vector<std::string> ranks;
        for (int r : c.ranks) ranks.push_back(absl::StrCat(r));
        o.AddRaw("ranks", JsonArray(ranks));
        *ctx.out << o.str() << "\n";
      } else {
        *ctx.out << RenderCollapsedLine(c) << "\n";
      }
    }
  };
  Reconnector reconnect(ctx.err, ctx.reconnect_for);
  bool seen = false;  // A line: resume after it, not from the tail again.
  while (true) {
    grpc::ClientContext rpc;
    auto reader = ctx.stub->StreamLogs(&rpc, req);
    v1::LogBatch batch;
    while (reader->Read(&batch)) {
      reconnect.Connected();
      SanitizeMessage(&batch);
      for (const v1::LogLine& l : batch.lines()) {
        if (collapse) {
          print(collapser.Add(l, absl::Now()));
        } else {
          *ctx.out << (ctx.json ? ToJson(l) : RenderLogLine(l, rank < 0)) << "\n";
        }
        req.set_after_seq(l.seq());
        seen = true;
      }
      if (collapse) print(collapser.Expire(absl::Now()));
      ctx.out->flush();
    }
    absl::Status st = FromGrpcStatus(reader->Finish());
    if (collapse && (st.ok() || !follow)) print(collapser.Flush());
    if (st.ok()) return kCtlOk;
    if (!follow || !reconnect.Retry(st)) {
      return reconnect.lost() ? ReportLost(ctx, st) : ReportError(ctx, st, job_id);
    }
    FollowLeader(ctx);  // Another coordinator may lead now.
    if (seen) req.set_tail(0);
  }
}

int Workers(CtlContext& ctx, int limit, bool summary_only, const std::string& page_token) {
  constexpr int kPage = 1000;  // Each reply stays small, whatever the cluster's size.
  v1::ListWorkersResponse all;
  v1::ListWorkersRequest req;
  req.set_summary_only(summary_only);
  req.set_page_token(page_token);
  while (true) {
    req.set_limit(limit > 0 ? std::min(kPage, limit - all.workers_size()) : kPage);
    grpc::ClientContext rpc;
    SetDeadline(rpc);
    v1::ListWorkersResponse page;
    absl::Status st = FromGrpcStatus(ctx.stub->ListWorkers(&rpc, req, &page));
    if (!st.ok()) return ReportError(ctx, st);
    for (auto& w : *page.mutable_workers()) *all.add_workers() = std::move(w);
    *all.mutable_summary() = page.summary();
    all.set_coordinator_version(page.coordinator_version());
    all.set_next_page_token(page.next_page_token());
    if (summary_only || page.next_page_token().empty() ||
        (limit > 0 && all.workers_size() >= limit)) {
      break;
    }
    req.set_page_token(page.next_page_token());
  }
  SanitizeMessage(&all);
  if (ctx.json) {
    *ctx.out << ToJson(all) << "\n";
    return kCtlOk;
  }
  const std::vector<v1::Worker> workers(all.workers().begin(), all.workers().end());
  for (const std::string& w : WorkerVersionWarnings(workers, all.coordinator_version())) {
    *ctx.err << w << "\n";
  }
  if (!summary_only) {
    *ctx.out << RenderWorkers(workers, absl::Now());
  }
  *ctx.out << RenderWorkerSummary(all.summary()) << "\n";
  if (!summary_only && !all.next_page_token().empty()) {
    *ctx.out << "(the first " << all.workers_size() << "; more with `ddpctl workers --limit "
             << limit << " --page-token " << all.next_page_token() << "`, all with --limit 0)\n";
  }
  return kCtlOk;
}

int WorkerMaintenance(CtlContext& ctx, const std::string& action, const std::string& name,
                      v1::DrainPolicy policy) {
  grpc::ClientContext rpc;
  SetDeadline(rpc);
  v1::Worker w;
  absl::Status st;
  if (action == "rm") {
    v1::RemoveWorkerRequest req;
    req.set_worker(name);
    v1::RemoveWorkerResponse resp;
    st = FromGrpcStatus(ctx.stub->RemoveWorker(&rpc, req, &resp));
    if (!st.ok()) return ReportError(ctx, st);
    if (ctx.json) {
      *ctx.out << "{\"worker\":\"" << JsonEscape(name) << "\",\"removed\":true}\n";
    } else {
      *ctx.out << "worker " << name << " removed\n";
    }
    return kCtlOk;
  }
  if (action == "cordon") {
    v1::CordonWorkerRequest req;
    req.set_worker(name);
    st = FromGrpcStatus(ctx.stub->CordonWorker(&rpc, req, &w));
  } else if (action == "drain") {
    v1::DrainWorkerRequest req;
    req.set_worker(name);
    req.set_policy(policy);
    st = FromGrpcStatus(ctx.stub->DrainWorker(&rpc, req, &w));
  } else {
    v1::UncordonWorkerRequest req;
    req.set_worker(name);
    st = FromGrpcStatus(ctx.stub->UncordonWorker(&rpc, req, &w));
  }
  if (!st.ok()) return ReportError(ctx, st);
  SanitizeMessage(&w);
  if (ctx.json) {
    *ctx.out << ToJson(w) << "\n";
    return kCtlOk;
  }
  *ctx.out << DescribeMaintenance(w) << "\n";
  return kCtlOk;
}

}  // namespace ddp
