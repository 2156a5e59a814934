// Who may call the coordinator: roles, identities, and the token file.
//
// The coordinator's `--auth-token-file` holds one `token role [name]` per line
// (`#` starts a comment). Roles:
//   admin   every JobService call, including cancelling anyone's job
//   user    submit, read, cancel (its own jobs, once jobs record their submitter)
//   viewer  read only (get, list, watch, logs, workers)
//   worker  WorkerService only, speaking for the worker `name` (required)
// Tokens are kept only as SHA-256 digests and compared in constant time against
// every entry, so neither the table nor the time a lookup takes reveals a token.
// No gRPC here: the coordinator's adapter extracts the presented token and asks.
#ifndef DDP_COMMON_AUTH_TOKENS_H_
#define DDP_COMMON_AUTH_TOKENS_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ddp {

enum class Role { kAdmin, kUser, kViewer, kWorker };

const char* RoleName(Role role);
std::optional<Role> ParseRole(absl::string_view name);

// The authenticated caller of an RPC.
struct Identity {
  std::string name;  // Token's name (default: the role's name), or the certificate's.
  Role role = Role::kViewer;
  // How it was established: "token", "certificate", or "open" (no authentication
  // configured: every caller is trusted, as on a loopback quickstart).
  std::string via;
};

// Tokens are 16 to 4096 printable ASCII characters without spaces (they travel in an
// HTTP/2 header). OK or INVALID_ARGUMENT saying which rule failed; never echoes it.
absl::Status CheckTokenSyntax(absl::string_view token);

class TokenTable {
 public:
  TokenTable() = default;

  // Parses a token file's text. Errors (INVALID_ARGUMENT) name `source`, the line and
  // the problem, never the token: an unknown role, a worker without a name, a token
  // that is too short, a token listed twice.
  static absl::StatusOr<TokenTable> Parse(absl::string_view text, absl::string_view source);
  // Reads then parses; NOT_FOUND when the file cannot be read.
  static absl::StatusOr<TokenTable> Load(const std::string& path);

  // The identity of `token`, or nullopt. Runs in time independent of which entry (if
  // any) matches: every entry's digest is compared in full.
  std::optional<Identity> Find(absl::string_view token) const;
  size_t size() const { return entries_.size(); }
  bool HasRole(Role role) const;

 private:
  using Digest = std::array<uint8_t, 32>;
  struct Entry {
    Digest digest;
    Identity identity;
  };
  static Digest Sha256(absl::string_view text);

  std::vector<Entry> entries_;
};

// A client's token file (ddpctl --token-file, ddp-worker --token-file): the token
// alone, surrounding whitespace ignored. Errors never echo the file's content.
absl::StatusOr<std::string> ReadClientToken(const std::string& path);

}  // namespace ddp

#endif  // DDP_COMMON_AUTH_TOKENS_H_
