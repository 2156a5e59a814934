// What the model.gpt tests share: the flavour's Python (torch 1.13 or 2.x, the PyTorch
// the trainer is held to) run live, and byte-level token files made from a text every
// Debian system has, by scripts/make_tokens.py (the script users run).
#ifndef DDP_TESTS_TRAINER_GPT_TEST_UTIL_H_
#define DDP_TESTS_TRAINER_GPT_TEST_UTIL_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/common/run_captured.h"
#include "tests/trainer/trainer_harness.h"

namespace ddp::testing {

// GPL-3 as base-files ships it: 35,149 bytes of English, 31,635 train and 3,514
// validation tokens at make_tokens.py's default split.
inline constexpr char kGplText[] = "/usr/share/common-licenses/GPL-3";

// `args` run by the flavour's Python (or `python`) from the source tree; fails unless it
// exits 0.
inline absl::StatusOr<CapturedRun> RunPython(const std::vector<std::string>& args,
                                             absl::Duration timeout = absl::Minutes(5),
                                             const std::string& python = DDP_REFERENCE_PYTHON) {
  SpawnOptions o;
  o.argv = {python};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.env["OMP_NUM_THREADS"] = "1";
  auto run = RunCaptured(o, timeout);
  if (!run.ok()) return run.status();
  if (!run->exit.ok()) {
    return absl::InternalError(absl::StrCat(args.empty() ? "python" : args[0], ": ",
                                            run->exit.ToString(), "\n", run->err));
  }
  return run;
}

// DIR/train.bin and DIR/val.bin (uint16, byte-level) from kGplText.
inline absl::Status MakeByteTokens(const std::string& dir) {
  auto run = RunPython({SourceDir() + "/scripts/make_tokens.py", "--out", dir, kGplText});
  return run.ok() ? absl::OkStatus() : run.status();
}

}  // namespace ddp::testing

#endif  // DDP_TESTS_TRAINER_GPT_TEST_UTIL_H_
