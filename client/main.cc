// ddpctl: the command line for ddp. Flags are parsed here (declared per verb in
// verbs.cc, whose table also holds each verb's checks and handler) and nowhere else.
//
//   ddpctl submit job.yaml [--watch]      ddpctl watch JOB
//   ddpctl get JOB [--history]            ddpctl list [--limit N]
//   ddpctl cancel JOB [--no-wait]         ddpctl logs JOB [-f] [--rank N] [--tail N] [--collapse]
//   ddpctl workers [--limit N] [--summary] ddpctl plot JOB [-o FILE.svg|FILE.png|json]
//   ddpctl workers cordon|uncordon|drain|rm NAME [--wait|--now]
//   ddpctl completion bash|zsh
// Every verb that talks to the coordinator takes, before or after the verb (as kubectl
// and git take theirs), --coordinator HOST:PORT (default:
// $DDP_COORDINATOR, then 127.0.0.1:29400) -o table|json, and for a secured
// coordinator --tls-ca FILE (default $DDP_TLS_CA) and --token-file FILE (or $DDP_TOKEN).
#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "common/auth/tokens.h"
#include "client/verbs.h"
#include "common/flags.h"
#include "common/version.h"

namespace {

// The global flags that take a value: accepted before the verb as after it (as kubectl
// and git accept theirs), so `ddpctl --coordinator H:P list` works.
bool IsGlobalValueFlag(const std::string& a) {
  return a == "--coordinator" || a == "-o" || a == "--output" || a == "--tls-ca" ||
         a == "--token-file";
}
bool IsGlobalFlagWithValue(const std::string& a) {
  for (const char* prefix : {"--coordinator=", "-o=", "--output=", "--tls-ca=", "--token-file="}) {
    if (a.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

// Splits argv into the verb and the rest (flags in their order, wherever they were):
// the verb is the first word that is neither a global flag nor its value. Empty if
// there is none.
std::string TakeVerb(int argc, char** argv, std::vector<std::string>* rest) {
  std::string verb;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (!verb.empty()) {
      rest->push_back(a);
    } else if (IsGlobalValueFlag(a) && i + 1 < argc) {
      rest->push_back(a);
      rest->push_back(argv[++i]);
    } else if (IsGlobalFlagWithValue(a)) {
      rest->push_back(a);
    } else {
      verb = a;
    }
  }
  return verb;
}

}  // namespace

int main(int argc, char** argv) {
  if (ddp::VersionRequested(argc, argv)) {
    std::cout << ddp::VersionLine("ddpctl") << "\n";
    return ddp::kCtlOk;
  }
  std::vector<std::string> args;
  const std::string verb = TakeVerb(argc, argv, &args);
  if (verb.empty() || verb == "help" || verb == "--help" || verb == "-h") {
    // `ddpctl help VERB` is `ddpctl VERB --help`.
    const ddp::Verb* v = !args.empty() ? ddp::FindVerb(args.back()) : nullptr;
    std::cout << (v ? ddp::VerbHelp(*v) : ddp::GeneralUsage());
    return verb.empty() ? ddp::kCtlUsage : ddp::kCtlOk;
  }
  const ddp::Verb* spec = ddp::FindVerb(verb);
  if (spec == nullptr) {
    std::cerr << "ddpctl: unknown verb '" << verb << "'\n\n" << ddp::GeneralUsage();
    return ddp::kCtlUsage;
  }
  ddp::CtlFlags f;
  const char* env = std::getenv("DDP_COORDINATOR");
  f.coordinator = env && *env ? env : "127.0.0.1:29400";
  const char* ca_env = std::getenv("DDP_TLS_CA");
  f.tls_ca = ca_env ? ca_env : "";
  ddp::FlagSet flags("ddpctl " + verb, spec->summary);
  ddp::DeclareFlags(verb, flags, &f);
  auto positional = flags.Parse(args);
  if (flags.help_requested()) {
    std::cout << ddp::VerbHelp(*spec);
    return ddp::kCtlOk;
  }
  if (!positional.ok()) {
    std::cerr << "ddpctl: " << positional.status().message() << "\n";
    return ddp::kCtlUsage;
  }
  if (positional->size() != spec->arity &&
      (spec->alt_arity == 0 || positional->size() != spec->alt_arity)) {
    std::cerr << "ddpctl " << verb << ": expected " << spec->arity
              << (spec->alt_arity ? absl::StrCat(" or ", spec->alt_arity) : "") << " argument"
              << (spec->arity == 1 && spec->alt_arity == 0 ? "" : "s") << ", got "
              << positional->size() << "\n\n"
              << ddp::VerbHelp(*spec);
    return ddp::kCtlUsage;
  }
  if (absl::Status st = spec->check(f, *positional); !st.ok()) {
    std::cerr << "ddpctl " << verb << ": " << st.message() << "\n";
    return ddp::kCtlUsage;
  }
  if (!spec->needs_coordinator) return spec->run(nullptr, f, *positional);
  ddp::ChannelSecurity security;
  security.ca_file = f.tls_ca;
  if (!f.token_file.empty()) {
    auto token = ddp::ReadClientToken(f.token_file);
    if (!token.ok()) {
      std::cerr << "ddpctl: --token-file: " << token.status().message() << "\n";
      return ddp::kCtlUsage;
    }
    security.token = *token;
  } else if (const char* env_token = std::getenv("DDP_TOKEN"); env_token && *env_token) {
    security.token = env_token;
    if (absl::Status st = ddp::CheckTokenSyntax(security.token); !st.ok()) {
      std::cerr << "ddpctl: DDP_TOKEN: " << st.message() << "\n";
      return ddp::kCtlUsage;
    }
  }
  auto made = ddp::MakeSecureContext(f.coordinator, security, f.output == "json",
                                     isatty(STDOUT_FILENO), &std::cout, &std::cerr);
  if (!made.ok()) {
    std::cerr << "ddpctl: " << made.status().message() << "\n";
    return ddp::kCtlUsage;
  }
  ddp::CtlContext ctx = *std::move(made);
  return spec->run(&ctx, f, *positional);
}
