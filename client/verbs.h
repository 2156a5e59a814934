// ddpctl's verbs as one table: each verb's name, arguments, help, flags, checks and
// handler. main.cc parses with it and runs the verb's handler, `ddpctl VERB --help`
// prints from it, and `ddpctl completion` generates shell completion from it, so the
// three never disagree. A new verb is one entry in verbs.cc.
#ifndef DDP_CLIENT_VERBS_H_
#define DDP_CLIENT_VERBS_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/flags.h"

namespace ddp {

struct CtlContext;  // client/commands.h

// Every ddpctl flag's value, bound by DeclareFlags.
struct CtlFlags {
  std::string coordinator;  // --coordinator (default: $DDP_COORDINATOR, 127.0.0.1:29400)
  std::string output = "table";
  bool watch = false, history = false, no_wait = false, follow = false, collapse = false;
  int limit = 100, rank = -1, tail = 0, width = 960, height = 720;
  // workers: --limit (0: all), --summary, --page-token; drain: --wait, --now.
  bool summary = false, drain_wait = false, drain_now = false;
  bool diagnose_now = false;  // diagnose --now
  std::string page_token;
  std::string action;  // workers: cordon, uncordon, drain or rm (taken from the arguments).
  // A secured coordinator: its CA (--tls-ca, default $DDP_TLS_CA) and a token file
  // (--token-file; default: the token itself in $DDP_TOKEN).
  std::string tls_ca, token_file;
};

struct Verb {
  const char* name;
  const char* args;     // "JOB", "FILE", "" ...
  size_t arity;         // Positional arguments.
  bool needs_coordinator;
  const char* summary;  // One line.
  const char* details;  // More lines for `VERB --help`, or "".
  const char* example;
  // Declares the verb's own flags on `flags`, bound to `f` (DeclareFlags adds the
  // common ones).
  void (*flags)(FlagSet& flags, CtlFlags* f);
  // Checks the parsed flags and arguments beyond their count (main prints the
  // message after "ddpctl VERB: " and exits 2); may take arguments out of `args`.
  absl::Status (*check)(CtlFlags& f, std::vector<std::string>& args);
  // Runs the verb and returns ddpctl's exit code (commands.h). `ctx` is connected to
  // the coordinator when needs_coordinator, null otherwise.
  int (*run)(CtlContext* ctx, const CtlFlags& f, const std::vector<std::string>& args);
  // Another accepted count of positional arguments (0: only `arity`): `workers` takes
  // none (list) or two (cordon|uncordon|drain|rm NAME).
  size_t alt_arity = 0;
};

const std::vector<Verb>& Verbs();
const Verb* FindVerb(const std::string& name);

// Declares `verb`'s flags (the common ones included) on `flags`, bound to `f`.
void DeclareFlags(const std::string& verb, FlagSet& flags, CtlFlags* f);

// `ddpctl --help`: every verb on a line or two.
std::string GeneralUsage();
// `ddpctl VERB --help`: synopsis, what it does, its flags and an example.
std::string VerbHelp(const Verb& verb);

}  // namespace ddp

#endif  // DDP_CLIENT_VERBS_H_
