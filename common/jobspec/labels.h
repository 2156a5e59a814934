// Node labels (ddp-worker --label KEY=VALUE) and the node_selector that matches them
// (job.yaml). One definition of what a label may look like, shared by the worker's
// flags, the coordinator's check of a registration and the job-file parser.
//
// A key is 1-63 of [A-Za-z0-9._/-] starting with a letter or digit ("pool",
// "gpu", "slurm_job", "example.com/rack"); a value is 0-63 of [A-Za-z0-9._-]
// ("team-a", "h100", "1234"). The shape is Kubernetes' label syntax, loosened on
// the key's prefix, so that labels carry over to Prometheus and back unchanged.
#ifndef DDP_COMMON_JOBSPEC_LABELS_H_
#define DDP_COMMON_JOBSPEC_LABELS_H_

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ddp {

using Labels = std::map<std::string, std::string>;

inline constexpr size_t kMaxLabels = 64;  // Per worker, and per node_selector.

bool ValidLabelKey(const std::string& key);
bool ValidLabelValue(const std::string& value);

// "KEY=VALUE" entries (flags) into labels. INVALID_ARGUMENT naming the entry: no '=',
// a key or value of the wrong shape, a key given twice, more than kMaxLabels.
absl::StatusOr<Labels> ParseLabelList(const std::vector<std::string>& entries);

// Every label (key, value) of labels: INVALID_ARGUMENT naming the first bad one.
absl::Status CheckLabels(const Labels& labels);

// Whether `labels` has every key of `selector` with the same value (an empty
// selector matches every node).
bool SelectorMatches(const Labels& selector, const Labels& labels);

// Whether no node could match both: some key required by both with different values.
bool SelectorsDisjoint(const Labels& a, const Labels& b);

// "pool=team-a,gpu=h100" (key order), "" for none.
std::string FormatLabels(const Labels& labels);

}  // namespace ddp

#endif  // DDP_COMMON_JOBSPEC_LABELS_H_
