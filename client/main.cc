// ddpctl: the command line for ddp. Flags are parsed here and nowhere else.
//
//   ddpctl submit job.yaml [--watch]      ddpctl watch JOB
//   ddpctl get JOB [--history]            ddpctl list [--limit N]
//   ddpctl cancel JOB [--no-wait]         ddpctl logs JOB [-f] [--rank N] [--tail N]
//   ddpctl workers
// Every verb takes --coordinator HOST:PORT (default: $DDP_COORDINATOR, then
// 127.0.0.1:29400) and -o table|json.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <map>

#include "client/commands.h"
#include "common/flags.h"

namespace {

constexpr char kUsage[] = R"(usage: ddpctl VERB [ARGS] [--coordinator HOST:PORT] [-o table|json]

verbs:
  submit FILE [--watch]     validate and queue a job.yaml; prints the job id
  watch JOB                 live per-rank table; exits 0 if the job succeeded,
                            1 if it failed, 3 if it was cancelled, 4 if the
                            coordinator went away and did not return in 60 s
  get JOB [--history]       state, rank table, latest metrics and epochs
  list [--limit N]          jobs, newest first
  cancel JOB [--no-wait]    cancel; waits until its trainers have stopped
  logs JOB [-f] [--rank N] [--tail N]
                            trainer output (stdout, stderr and notable events);
                            -f follows it until the job ends (exit 4 as watch)
  workers                   registered workers and their slots

The coordinator defaults to $DDP_COORDINATOR, then 127.0.0.1:29400.
)";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "help" || std::string(argv[1]) == "--help" ||
      std::string(argv[1]) == "-h") {
    std::cout << kUsage;
    return argc < 2 ? ddp::kCtlUsage : ddp::kCtlOk;
  }
  const std::string verb = argv[1];
  const char* env = std::getenv("DDP_COORDINATOR");
  std::string coordinator = env && *env ? env : "127.0.0.1:29400";
  std::string output = "table";
  bool watch = false, history = false, no_wait = false, follow = false;
  int limit = 100, rank = -1, tail = 0;

  ddp::FlagSet flags("ddpctl " + verb, "");
  flags.String("coordinator", &coordinator, "the coordinator's HOST:PORT");
  flags.String("output", &output, "table or json");
  flags.Alias("o", "output");
  if (verb == "submit") flags.Bool("watch", &watch, "watch the job after submitting it");
  if (verb == "get") flags.Bool("history", &history, "include every stored step (with -o json)");
  if (verb == "list") flags.Int("limit", &limit, "how many jobs");
  if (verb == "cancel") flags.Bool("no-wait", &no_wait, "return without waiting for trainers");
  if (verb == "logs") {
    flags.Bool("follow", &follow, "keep streaming new output until the job ends");
    flags.Alias("f", "follow");
    flags.Int("rank", &rank, "only this rank's output");
    flags.Int("tail", &tail, "only the last N lines");
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  auto positional = flags.Parse(args);
  if (flags.help_requested()) {
    std::cout << kUsage;
    return ddp::kCtlOk;
  }
  if (!positional.ok()) {
    std::cerr << "ddpctl: " << positional.status().message() << "\n";
    return ddp::kCtlUsage;
  }
  if (output != "table" && output != "json") {
    std::cerr << "ddpctl: -o must be table or json (got '" << output << "')\n";
    return ddp::kCtlUsage;
  }
  static const std::map<std::string, size_t> kArity = {
      {"submit", 1}, {"watch", 1}, {"get", 1},  {"list", 0},
      {"cancel", 1}, {"logs", 1},  {"workers", 0}};
  auto arity = kArity.find(verb);
  if (arity == kArity.end()) {
    std::cerr << "ddpctl: unknown verb '" << verb << "'\n\n" << kUsage;
    return ddp::kCtlUsage;
  }
  if (positional->size() != arity->second) {
    std::cerr << "ddpctl " << verb << ": expected " << arity->second << " argument"
              << (arity->second == 1 ? "" : "s") << ", got " << positional->size() << "\n\n"
              << kUsage;
    return ddp::kCtlUsage;
  }
  ddp::CtlContext ctx = ddp::MakeContext(coordinator, output == "json", isatty(STDOUT_FILENO),
                                         &std::cout, &std::cerr);
  const std::string arg = positional->empty() ? "" : positional->front();
  if (verb == "submit") return ddp::Submit(ctx, arg, watch);
  if (verb == "watch") return ddp::Watch(ctx, arg);
  if (verb == "get") return ddp::Get(ctx, arg, history);
  if (verb == "list") return ddp::List(ctx, limit);
  if (verb == "cancel") return ddp::Cancel(ctx, arg, !no_wait);
  if (verb == "logs") return ddp::Logs(ctx, arg, follow, rank, tail);
  return ddp::Workers(ctx);
}
