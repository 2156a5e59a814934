#include "client/verbs.h"

#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/commands.h"
#include "client/completion.h"
#include "common/status_macros.h"

namespace ddp {
namespace {

using Args = std::vector<std::string>;

void NoFlags(FlagSet&, CtlFlags*) {}

absl::Status TableOrJson(CtlFlags& f, Args&) {
  if (f.output == "table" || f.output == "json") return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("-o must be table or json (got '", f.output, "')"));
}

absl::Status AnyOutput(CtlFlags&, Args&) { return absl::OkStatus(); }

void WorkersFlags(FlagSet& flags, CtlFlags* f) {
  f->limit = 0;  // All of them.
  flags.Int("limit", &f->limit, "how many workers (0: all)");
  flags.Bool("summary", &f->summary, "only the cluster's summary");
  flags.String("page-token", &f->page_token, "start after this page token (from --limit)");
  flags.Bool("wait", &f->drain_wait, "drain: let the jobs on the worker run to their end");
  flags.Bool("now", &f->drain_now, "drain: restart its jobs elsewhere at once");
}

// workers [ACTION NAME]: ACTION moves from the arguments into f.action.
absl::Status WorkersCheck(CtlFlags& f, Args& args) {
  DDP_RETURN_IF_ERROR(TableOrJson(f, args));
  if (args.size() == 2) {
    f.action = args[0];
    args.erase(args.begin());
    if (f.action != "cordon" && f.action != "uncordon" && f.action != "drain" && f.action != "rm") {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown action '", f.action, "': cordon, uncordon, drain or rm"));
    }
  }
  if ((f.drain_wait || f.drain_now) && f.action != "drain") {
    return absl::InvalidArgumentError("--wait and --now go with `drain`");
  }
  if (f.drain_wait && f.drain_now) {
    return absl::InvalidArgumentError("drain: --wait or --now, not both");
  }
  if (f.limit < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--limit must be >= 0 (got ", f.limit, "; 0 means all)"));
  }
  return absl::OkStatus();
}

int RunWorkers(CtlContext* ctx, const CtlFlags& f, const Args& args) {
  if (f.action.empty()) return Workers(*ctx, f.limit, f.summary, f.page_token);
  const v1::DrainPolicy policy = f.drain_now    ? v1::DRAIN_NOW
                                 : f.drain_wait ? v1::DRAIN_WAIT
                                                : v1::DRAIN_AT_CHECKPOINT;
  return WorkerMaintenance(*ctx, f.action, args[0], policy);
}

int RunCompletion(CtlContext*, const CtlFlags&, const Args& args) {
  auto script = CompletionScript(args[0]);
  if (!script.ok()) {
    std::cerr << "ddpctl completion: " << script.status().message() << "\n";
    return kCtlUsage;
  }
  std::cout << *script;
  return kCtlOk;
}

}  // namespace

const std::vector<Verb>& Verbs() {
  static const std::vector<Verb> kVerbs = {
      {"submit", "FILE", 1, true, "validate a job.yaml and queue it; prints the job id",
       "Relative paths in the job resolve against the file's directory, which must exist\n"
       "at the same path on every node. With --watch, exits as watch does.",
       "ddpctl submit examples/cancer.yaml --watch",
       [](FlagSet& fl, CtlFlags* f) {
         fl.Bool("watch", &f->watch, "watch the job after submitting it");
       },
       TableOrJson,
       [](CtlContext* ctx, const CtlFlags& f, const Args& a) { return Submit(*ctx, a[0], f.watch); }},
      {"watch", "JOB", 1, true, "live per-rank table until the job ends",
       "Marks stragglers (a rank whose compute time per step is well above the others',\n"
       "with the ratio) and stale ranks (no update for many step times). Exits 0 if the\n"
       "job succeeded, 1 if it failed, 3 if it was cancelled, 4 if the coordinator went\n"
       "away and did not return within 60 s.",
       "ddpctl watch cancer-ddp-3yxyd", NoFlags, TableOrJson,
       [](CtlContext* ctx, const CtlFlags&, const Args& a) { return Watch(*ctx, a[0]); }},
      {"get", "JOB", 1, true, "state, rank table per attempt, latest metrics and epochs",
       "--history -o json adds every stored step of every rank.",
       "ddpctl get cancer-ddp-3yxyd -o json --history",
       [](FlagSet& fl, CtlFlags* f) {
         fl.Bool("history", &f->history, "include every stored step (with -o json)");
       },
       TableOrJson,
       [](CtlContext* ctx, const CtlFlags& f, const Args& a) { return Get(*ctx, a[0], f.history); }},
      {"diagnose", "JOB", 1, true,
       "where each rank of the latest attempt is: phase, last collective, the wait, the stack",
       "From the ranks' flight recorders (ddp-trainer and libddp programs keep one): while\n"
       "the attempt runs, as their workers read them at the last heartbeat; once it ended,\n"
       "its reason (a stall's says whom the others waited for, and why) and what the\n"
       "workers logged of the ranks they stopped. With the stacks the workers took (a\n"
       "stall takes them; --now takes them at once, for any program): Python (py-spy) and\n"
       "native (eu-stack). -o json: the attempt and those lines.",
       "ddpctl diagnose cancer-ddp-3yxyd --now",
       [](FlagSet& fl, CtlFlags* f) {
         fl.Bool("now", &f->diagnose_now, "take every running rank's stacks now and show them");
       },
       TableOrJson,
       [](CtlContext* ctx, const CtlFlags& f, const Args& a) {
         return Diagnose(*ctx, a[0], f.diagnose_now);
       }},
      {"list", "", 0, true, "jobs, newest first", "", "ddpctl list --limit 20",
       [](FlagSet& fl, CtlFlags* f) { fl.Int("limit", &f->limit, "how many jobs"); }, TableOrJson,
       [](CtlContext* ctx, const CtlFlags& f, const Args&) { return List(*ctx, f.limit); }},
      {"cancel", "JOB", 1, true, "cancel a job; waits until its trainers have stopped", "",
       "ddpctl cancel cancer-ddp-3yxyd",
       [](FlagSet& fl, CtlFlags* f) {
         fl.Bool("no-wait", &f->no_wait, "return without waiting for trainers");
       },
       TableOrJson,
       [](CtlContext* ctx, const CtlFlags& f, const Args& a) {
         return Cancel(*ctx, a[0], !f.no_wait);
       }},
      {"logs", "JOB", 1, true, "trainer output (stdout, stderr and notable events)",
       "-f follows until the job ends (exit 4 as watch). --collapse folds a line that\n"
       "several ranks printed alike into one, prefixed with the ranks: [ranks 0-3].",
       "ddpctl logs cancer-ddp-3yxyd -f --collapse",
       [](FlagSet& fl, CtlFlags* f) {
         fl.Bool("follow", &f->follow, "keep streaming new output until the job ends");
         fl.Alias("f", "follow");
         fl.Int("rank", &f->rank, "only this rank's output");
         fl.Int("tail", &f->tail, "only the last N lines");
         fl.Bool("collapse", &f->collapse,
                 "fold a line several ranks printed alike into one: [ranks 0-3] text");
       },
       TableOrJson,
       [](CtlContext* ctx, const CtlFlags& f, const Args& a) {
         return Logs(*ctx, a[0], f.follow, f.rank, f.tail, f.collapse);
       }},
      {"workers", "[cordon|uncordon|drain|rm NAME]", 0, true,
       "list workers, or take one out of service (cordon, drain) and back, or forget it",
       "Without arguments: every worker with its state, slots and version, then a summary.\n"
       "Follows the coordinator's pages (1,000 workers each); --limit N prints the first N\n"
       "and the command for the next page, --summary only the cluster's summary. Warns\n"
       "(on stderr) about workers whose version differs from the coordinator's.\n"
       "\n"
       "Node maintenance (an admin token on a secured coordinator; stored, so it survives\n"
       "coordinator and agent restarts):\n"
       "  cordon NAME     takes no new ranks; its trainers keep running\n"
       "  drain NAME      takes no new ranks, and each job on it restarts on other workers\n"
       "                  right after its next checkpoint, resuming from it (a job without\n"
       "                  periodic checkpoints runs to its end there); --now restarts them\n"
       "                  at once from their last checkpoint, --wait lets them finish there.\n"
       "                  These restarts do not count against a job's max_restarts.\n"
       "  uncordon NAME   takes new ranks again (ends a cordon or a drain)\n"
       "  rm NAME         forgets a lost worker (one that is alive is refused)",
       "ddpctl workers drain node-7", WorkersFlags, WorkersCheck, RunWorkers, 2},
      {"plot", "JOB", 1, true, "training curves: per-rank loss and samples/s, epochs, restarts",
       "-o FILE.svg or FILE.png writes a picture; without -o a Unicode chart is drawn on\n"
       "the terminal; -o json prints the series. Restarts (attempt boundaries) are marked.",
       "ddpctl plot cancer-ddp-3yxyd -o loss.svg",
       [](FlagSet& fl, CtlFlags* f) {
         fl.Int("width", &f->width, "picture width in pixels");
         fl.Int("height", &f->height, "picture height in pixels");
       },
       AnyOutput,
       [](CtlContext* ctx, const CtlFlags& f, const Args& a) {
         return Plot(*ctx, a[0], {f.output, f.width, f.height});
       }},
      {"tensorboard", "JOB DIR", 2, true,
       "export the job's metrics as a TensorBoard run (DIR/JOB)",
       "Every stored step of every rank (loss, samples/s, step and communication time\n"
       "against the global step), each epoch's summary, and the attempts and live\n"
       "recoveries as text, in DIR/JOB/events.out.tfevents.ddpctl; a finished job or a\n"
       "running one (export again to refresh). Then: tensorboard --logdir DIR",
       "ddpctl tensorboard cancer-ddp-3yxyd runs/", NoFlags, AnyOutput,
       [](CtlContext* ctx, const CtlFlags&, const Args& a) {
         return Tensorboard(*ctx, a[0], a[1]);
       }},
      {"completion", "bash|zsh", 1, false, "print a shell completion script",
       "Load it in the current shell, or install it for every session:\n"
       "  source <(ddpctl completion bash)\n"
       "  ddpctl completion bash > /etc/bash_completion.d/ddpctl\n"
       "  ddpctl completion zsh > \"${fpath[1]}/_ddpctl\"",
       "source <(ddpctl completion bash)", NoFlags, AnyOutput, RunCompletion},
  };
  return kVerbs;
}

const Verb* FindVerb(const std::string& name) {
  for (const Verb& v : Verbs()) {
    if (name == v.name) return &v;
  }
  return nullptr;
}

void DeclareFlags(const std::string& verb, FlagSet& flags, CtlFlags* f) {
  const Verb* v = FindVerb(verb);
  if (v == nullptr) return;
  if (v->needs_coordinator) {
    flags.String("coordinator", &f->coordinator,
                 "the coordinator's HOST:PORT, or several comma-separated for coordinators in "
                 "standby (the leader is found and followed) (default: $DDP_COORDINATOR, then "
                 "127.0.0.1:29400)");
    flags.String("tls-ca", &f->tls_ca,
                 "CA of the coordinator's certificate: connect with TLS (default $DDP_TLS_CA)");
    flags.String("token-file", &f->token_file,
                 "file holding this user's token (default: the token in $DDP_TOKEN)");
    flags.String("output", &f->output,
                 v->check == AnyOutput ? "FILE.svg or FILE.png to write, table (a terminal chart) or json"
                                       : "table or json");
    flags.Alias("o", "output");
  }
  v->flags(flags, f);
}

std::string GeneralUsage() {
  std::string out = "usage: ddpctl VERB [ARGS] [flags]\n\nverbs:\n";
  for (const Verb& v : Verbs()) {
    const std::string left = absl::StrCat(v.name, *v.args ? " " : "", v.args);
    absl::StrAppendFormat(&out, "  %-20s %s\n", left, v.summary);
  }
  absl::StrAppend(&out,
                  "\nEvery verb that talks to the coordinator takes, before or after the verb,\n"
                  "--coordinator HOST:PORT (default: $DDP_COORDINATOR, then 127.0.0.1:29400) and\n"
                  "-o table|json; a secured coordinator needs its CA (--tls-ca FILE or\n"
                  "$DDP_TLS_CA) and a token (--token-file FILE, or the token itself in $DDP_TOKEN).\n"
                  "`ddpctl VERB --help` shows a verb's flags and an example; `ddpctl --version`\n"
                  "the build.\n");
  return out;
}

std::string VerbHelp(const Verb& v) {
  CtlFlags unused;
  FlagSet flags(absl::StrCat("ddpctl ", v.name), v.summary);
  DeclareFlags(v.name, flags, &unused);
  std::string out = flags.Usage(absl::StrCat(*v.args ? " " : "", v.args, " [flags]"));
  if (*v.details) absl::StrAppend(&out, "\n", v.details, "\n");
  absl::StrAppend(&out, "\nexample:\n  ", v.example, "\n");
  return out;
}

}  // namespace ddp
