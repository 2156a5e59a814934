#include "common/jobspec/command_spec.h"

#include <signal.h>

#include "absl/strings/str_cat.h"

namespace ddp::jobspec_internal {

// `command: [program, arg, ...]`: a command job. Every entry is a scalar (numbers are
// taken as written: `--epochs, 10`), nothing is split or run through a shell.
void ParseCommand(Reader& r, const YAML::Node& root, JobSpec* spec) {
  const YAML::Node n = r.Sub(root, "command");
  if (!n) return;
  if (!n.IsSequence()) {
    r.Error(n, "command",
            n.IsScalar() ? "expected a list such as [python3, train.py, --epochs, \"10\"]: the "
                           "argv is not split and no shell runs it"
                         : "expected a list such as [python3, train.py, --epochs, \"10\"]");
    return;
  }
  if (n.size() == 0) {
    r.Error(n, "command", "must not be empty: name the program to run, e.g. [python3, train.py]");
    return;
  }
  if (n.size() > kMaxCommandArgs) {
    r.Error(n, "command", absl::StrCat("at most ", kMaxCommandArgs, " entries (got ", n.size(), ")"));
    return;
  }
  std::vector<std::string> argv;
  for (size_t i = 0; i < n.size(); ++i) {
    const YAML::Node a = n[i];
    const std::string path = absl::StrCat("command[", i, "]");
    if (!a.IsScalar()) {
      r.Error(a, path, "expected a string (one argument)");
      return;
    }
    const std::string& v = a.Scalar();
    if (v.size() > kMaxStringBytes || HasControlCharacter(v) || v.find('\0') != std::string::npos) {
      r.Error(a, path, absl::StrCat("arguments are at most ", kMaxStringBytes,
                                    " bytes without control characters"));
      return;
    }
    argv.push_back(v);
  }
  if (argv[0].empty()) {
    r.Error(n[0], "command[0]", "the program must not be empty");
    return;
  }
  spec->command = std::move(argv);
  if (r.Double(root, "stall_timeout_s", "", &spec->train.stall_timeout_s)) {
    NonNegative(r, root, "stall_timeout_s", "", spec->train.stall_timeout_s);
    AtMost(r, root, "stall_timeout_s", "", spec->train.stall_timeout_s,
           kCommandCollectiveTimeoutS - 1);
  }
  spec->train.collective_timeout_s = kCommandCollectiveTimeoutS;
  std::string sig;
  if (r.String(root, "notice_signal", "", &sig)) {
    static const std::pair<const char*, int> kSignals[] = {
        {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}, {"SIGINT", SIGINT}, {"SIGHUP", SIGHUP},
        {"SIGTERM", SIGTERM}};
    for (const auto& [name, number] : kSignals) {
      if (sig == name) spec->notice_signal = number;
    }
    if (spec->notice_signal == 0) {
      r.Error(root["notice_signal"], "notice_signal",
              absl::StrCat("must be SIGUSR1, SIGUSR2, SIGINT, SIGHUP or SIGTERM (got '", sig,
                           "')"));
    }
  }
}

// Exactly one kind: the user's program or the built-in trainer's sections.
bool CheckKind(Reader& r, const YAML::Node& root) {
  static const char* kTrainerSections[] = {"model", "data", "train", "checkpoint", "metrics"};
  if (root["command"]) {
    bool ok = true;
    for (const char* key : kTrainerSections) {
      if (!root[key]) continue;
      ok = false;
      r.Error(root[key], key,
              absl::StrCat("a job runs either its own program (command) or the built-in trainer "
                           "(model, data, train), not both: remove `", key,
                           "` or `command`",
                           std::string(key) == "checkpoint"
                               ? " (a program writes its own checkpoints and may report them "
                                 "with a `checkpoint` event line)"
                               : ""));
    }
    return ok;
  }
  if (root["stall_timeout_s"]) {
    r.Error(root["stall_timeout_s"], "stall_timeout_s",
            "is a command job's field; the built-in trainer's is train.stall_timeout_s");
  }
  if (root["notice_signal"]) {
    r.Error(root["notice_signal"], "notice_signal",
            "is a command job's field: the built-in trainer reads the notice itself");
  }
  if (!root["model"] && !root["data"] && !root["train"]) {
    r.Error(root, "command",
            "the job runs nothing: give either command: [program, args...] (your own "
            "torchrun-style program) or model, data and train (the built-in trainer)");
    return false;
  }
  return true;
}

}  // namespace ddp::jobspec_internal
