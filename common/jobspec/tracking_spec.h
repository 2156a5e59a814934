// job.yaml's `tracking` section (internal to ddp_jobspec): where the coordinator sends
// the job's metrics besides its own store (docs/job-spec.md "tracking").
#ifndef DDP_COMMON_JOBSPEC_TRACKING_SPEC_H_
#define DDP_COMMON_JOBSPEC_TRACKING_SPEC_H_

#include "common/jobspec/yaml_reader.h"

namespace ddp::jobspec_internal {

// `tracking: {mlflow: ...}` into spec->tracking, for both kinds of job:
//   mlflow: true | false                  on or off (unset: the coordinator's --mlflow-uri)
//   mlflow: http://host:5000              on, at that server
//   mlflow: {uri: ..., experiment: ...}   either or both
void ParseTracking(Reader& r, const YAML::Node& root, JobSpec* spec);

}  // namespace ddp::jobspec_internal

#endif  // DDP_COMMON_JOBSPEC_TRACKING_SPEC_H_
