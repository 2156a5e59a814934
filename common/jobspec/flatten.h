// job.yaml as flat parameters, `train.optimizer.lr = 0.01`: what an experiment tracker
// shows of a job (MLflow's run parameters).
#ifndef DDP_COMMON_JOBSPEC_FLATTEN_H_
#define DDP_COMMON_JOBSPEC_FLATTEN_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace ddp {

// Every scalar of the spec under its dotted path, in the file's order; a list of
// scalars is one value, "[16, 8]"; a list of mappings is indexed, "data.files.0.path".
// The top-level `env` is left out whole (its values are secrets more often than not:
// tokens, passwords), as are null values. Keys are cut to 250 bytes and values to
// 6,000 (MLflow's limits), a cut value ending in "...". INVALID_ARGUMENT for text
// that is not YAML (a stored spec always is).
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> FlattenSpec(
    const std::string& yaml_text);

}  // namespace ddp

#endif  // DDP_COMMON_JOBSPEC_FLATTEN_H_
