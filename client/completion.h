// `ddpctl completion bash|zsh`: shell completion generated from the verb table
// (verbs.h): verbs, each verb's flags, job ids from `ddpctl list` for JOB arguments,
// files for job.yaml and plot output.
#ifndef DDP_CLIENT_COMPLETION_H_
#define DDP_CLIENT_COMPLETION_H_

#include <string>

#include "absl/status/statusor.h"

namespace ddp {

// INVALID_ARGUMENT for a shell other than bash or zsh.
absl::StatusOr<std::string> CompletionScript(const std::string& shell);

}  // namespace ddp

#endif  // DDP_CLIENT_COMPLETION_H_
