// ddpctl's verbs as data: name, arguments, summary, example and flags. main.cc parses
// with it, `ddpctl VERB --help` prints from it, and `ddpctl completion` generates
// shell completion from it, so the three never disagree.
#ifndef DDP_CLIENT_VERBS_H_
#define DDP_CLIENT_VERBS_H_

#include <cstddef>
#include <string>
#include <vector>

#include "common/flags.h"

namespace ddp {

// Every ddpctl flag's value, bound by DeclareFlags.
struct CtlFlags {
  std::string coordinator;  // --coordinator (default: $DDP_COORDINATOR, 127.0.0.1:29400)
  std::string output = "table";
  bool watch = false, history = false, no_wait = false, follow = false, collapse = false;
  int limit = 100, rank = -1, tail = 0, width = 960, height = 720;
  // workers: --limit (0: all), --summary, --page-token; drain: --wait, --now.
  bool summary = false, drain_wait = false, drain_now = false;
  std::string page_token;
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
