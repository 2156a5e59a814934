#include "client/verbs.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ddp {

const std::vector<Verb>& Verbs() {
  static const std::vector<Verb> kVerbs = {
      {"submit", "FILE", 1, true, "validate a job.yaml and queue it; prints the job id",
       "Relative paths in the job resolve against the file's directory, which must exist\n"
       "at the same path on every node. With --watch, exits as watch does.",
       "ddpctl submit examples/cancer.yaml --watch"},
      {"watch", "JOB", 1, true, "live per-rank table until the job ends",
       "Marks stragglers (a rank whose compute time per step is well above the others',\n"
       "with the ratio) and stale ranks (no update for many step times). Exits 0 if the\n"
       "job succeeded, 1 if it failed, 3 if it was cancelled, 4 if the coordinator went\n"
       "away and did not return within 60 s.",
       "ddpctl watch cancer-ddp-3yxyd"},
      {"get", "JOB", 1, true, "state, rank table per attempt, latest metrics and epochs",
       "--history -o json adds every stored step of every rank.",
       "ddpctl get cancer-ddp-3yxyd -o json --history"},
      {"list", "", 0, true, "jobs, newest first", "", "ddpctl list --limit 20"},
      {"cancel", "JOB", 1, true, "cancel a job; waits until its trainers have stopped", "",
       "ddpctl cancel cancer-ddp-3yxyd"},
      {"logs", "JOB", 1, true, "trainer output (stdout, stderr and notable events)",
       "-f follows until the job ends (exit 4 as watch). --collapse folds a line that\n"
       "several ranks printed alike into one, prefixed with the ranks: [ranks 0-3].",
       "ddpctl logs cancer-ddp-3yxyd -f --collapse"},
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
       "ddpctl workers drain node-7", 2},
      {"plot", "JOB", 1, true, "training curves: per-rank loss and samples/s, epochs, restarts",
       "-o FILE.svg or FILE.png writes a picture; without -o a Unicode chart is drawn on\n"
       "the terminal; -o json prints the series. Restarts (attempt boundaries) are marked.",
       "ddpctl plot cancer-ddp-3yxyd -o loss.svg"},
      {"completion", "bash|zsh", 1, false, "print a shell completion script",
       "Load it in the current shell, or install it for every session:\n"
       "  source <(ddpctl completion bash)\n"
       "  ddpctl completion bash > /etc/bash_completion.d/ddpctl\n"
       "  ddpctl completion zsh > \"${fpath[1]}/_ddpctl\"",
       "source <(ddpctl completion bash)"},
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
  if (v != nullptr && v->needs_coordinator) {
    flags.String("coordinator", &f->coordinator,
                 "the coordinator's HOST:PORT (default: $DDP_COORDINATOR, then 127.0.0.1:29400)");
    flags.String("tls-ca", &f->tls_ca,
                 "CA of the coordinator's certificate: connect with TLS (default $DDP_TLS_CA)");
    flags.String("token-file", &f->token_file,
                 "file holding this user's token (default: the token in $DDP_TOKEN)");
  }
  if (verb == "plot") {
    flags.String("output", &f->output,
                 "FILE.svg or FILE.png to write, table (a terminal chart) or json");
    flags.Alias("o", "output");
    flags.Int("width", &f->width, "picture width in pixels");
    flags.Int("height", &f->height, "picture height in pixels");
  } else if (verb != "completion") {
    flags.String("output", &f->output, "table or json");
    flags.Alias("o", "output");
  }
  if (verb == "submit") flags.Bool("watch", &f->watch, "watch the job after submitting it");
  if (verb == "get") flags.Bool("history", &f->history, "include every stored step (with -o json)");
  if (verb == "list") flags.Int("limit", &f->limit, "how many jobs");
  if (verb == "workers") {
    flags.Int("limit", &f->limit, "how many workers (0: all)");
    flags.Bool("summary", &f->summary, "only the cluster's summary");
    flags.String("page-token", &f->page_token, "start after this page token (from --limit)");
    flags.Bool("wait", &f->drain_wait, "drain: let the jobs on the worker run to their end");
    flags.Bool("now", &f->drain_now, "drain: restart its jobs elsewhere at once");
  }
  if (verb == "cancel") flags.Bool("no-wait", &f->no_wait, "return without waiting for trainers");
  if (verb == "logs") {
    flags.Bool("follow", &f->follow, "keep streaming new output until the job ends");
    flags.Alias("f", "follow");
    flags.Int("rank", &f->rank, "only this rank's output");
    flags.Int("tail", &f->tail, "only the last N lines");
    flags.Bool("collapse", &f->collapse,
               "fold a line several ranks printed alike into one: [ranks 0-3] text");
  }
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
