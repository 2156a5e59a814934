// ddp-trainer: one rank of a distributed data-parallel training job.
//
//   RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29777 ddp-trainer --spec job.yaml
//
// Exit codes (common/exit_codes.h, failure.h): 0 trained to the end; 2 permanent (bad
// spec, data or model: restarting cannot help); 3 this node's fault (the device it needs
// is not here); 1 retryable (a peer died, a timeout, I/O).
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/contract/exit_codes.h"
#include "common/flags.h"
#include "common/jobspec/job_spec.h"
#include "common/logging.h"
#include "common/version.h"
#include "common/contract/events.h"
#include "libddp/engine/environment.h"
#include "trainer/trainer.h"

namespace {

int Fail(ddp::EventSink* events, const absl::Status& status, ddp::FailureKind kind) {
  std::string message(status.message());
  DDP_LOG(ERROR) << (kind == ddp::FailureKind::kRetryable
                         ? "error: "
                         : absl::StrCat(ddp::FailureKindName(kind), " error: "))
                 << message;
  if (events != nullptr) {
    ddp::ErrorEvent e;
    e.message = message;
    e.retryable = kind != ddp::FailureKind::kPermanent;
    e.node_fault = kind == ddp::FailureKind::kNodeFault;
    events->Emit(e);
  }
  return ddp::ExitCodeFor(kind);
}

}  // namespace

int main(int argc, char** argv) {
  if (ddp::VersionRequested(argc, argv)) {
    std::cout << ddp::VersionLine("ddp-trainer") << "\n";
    return ddp::kExitOk;
  }
  ::signal(SIGPIPE, SIG_IGN);  // A closed events reader must not kill training.
  std::string spec_path;
  bool check_only = false;
  ddp::FlagSet flags("ddp-trainer", "Trains one rank of a DDP job (torchrun environment).");
  flags.String("spec", &spec_path, "job.yaml to train");
  flags.Bool("check", &check_only, "validate the spec and environment, then exit");
  auto positional = flags.Parse(argc, argv);
  if (flags.help_requested()) {
    std::cout << flags.Usage(" --spec job.yaml") << "\nenvironment: RANK, WORLD_SIZE, "
              << "MASTER_ADDR, MASTER_PORT (required); LOCAL_RANK, LOCAL_WORLD_SIZE, "
              << "GROUP_RANK, DDP_EVENTS_FD, GLOO_SOCKET_IFNAME (optional)\n";
    return ddp::kExitOk;
  }
  if (!positional.ok()) return Fail(nullptr, positional.status(), ddp::FailureKind::kPermanent);
  if (spec_path.empty() || !positional->empty()) {
    std::cerr << flags.Usage(" --spec job.yaml");
    return ddp::kExitPermanent;
  }

  auto env = ddp::ReadEnvironment();
  if (!env.ok()) return Fail(nullptr, env.status(), ddp::FailureKind::kPermanent);
  ddp::SetLogPrefix("[rank " + std::to_string(env->rank) + "] ");
  ddp::EventSink events(env->events_fd, env->rank);

  auto spec = ddp::LoadJobSpecFile(spec_path);
  if (!spec.ok()) return Fail(&events, spec.status(), ddp::FailureKind::kPermanent);
  if (spec->is_command()) {
    return Fail(&events,
                absl::InvalidArgumentError(spec_path + " runs a command (`command:`), not the "
                                           "built-in trainer: submit it to a cluster, whose "
                                           "workers start the command itself"),
                ddp::FailureKind::kPermanent);
  }
  if (check_only) return ddp::kExitOk;

  ddp::Trainer trainer(*std::move(spec), *env, &events);
  absl::Status st = trainer.Run();
  if (!st.ok()) {
    const int code = Fail(&events, st, ddp::ClassifyFailure(st));
    // Exit without running destructors: tearing down a process group whose
    // collective failed can wait on its queued work (up to the collective timeout
    // each) or hang in the backend, and nothing is left to save.
    std::fflush(nullptr);
    std::_Exit(code);
  }
  return ddp::kExitOk;
}
