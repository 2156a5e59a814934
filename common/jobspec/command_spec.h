// job.yaml's command-job part (internal to ddp_jobspec): `command` and its fields,
// and the rule that a job runs either its own program or the built-in trainer.
#ifndef DDP_COMMON_JOBSPEC_COMMAND_SPEC_H_
#define DDP_COMMON_JOBSPEC_COMMAND_SPEC_H_

#include "common/jobspec/yaml_reader.h"

namespace ddp::jobspec_internal {

// Exactly one kind: `command`, or the built-in trainer's sections (model, data,
// train, checkpoint, metrics). False when the job cannot be parsed further.
bool CheckKind(Reader& r, const YAML::Node& root);

// `command` and `stall_timeout_s` into `spec` (a command job's root).
void ParseCommand(Reader& r, const YAML::Node& root, JobSpec* spec);

}  // namespace ddp::jobspec_internal

#endif  // DDP_COMMON_JOBSPEC_COMMAND_SPEC_H_
