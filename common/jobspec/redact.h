// Redaction of a job file for readers who may not see its secrets: the values of
// its `env` mapping (API keys, passwords handed to the trainers) are shown only to
// the job's owner and admins (docs/security.md).
#ifndef DDP_COMMON_JOBSPEC_REDACT_H_
#define DDP_COMMON_JOBSPEC_REDACT_H_

#include <string>

namespace ddp {

inline constexpr char kRedacted[] = "<redacted>";

// The job file with every `env` value replaced by kRedacted, keys and the rest kept
// (re-emitted: comments and layout are not). A file without `env` comes back as it
// is; one that does not parse as YAML comes back as a comment saying it is withheld,
// never as the original text.
std::string RedactSpecEnv(const std::string& spec_yaml);

}  // namespace ddp

#endif  // DDP_COMMON_JOBSPEC_REDACT_H_
