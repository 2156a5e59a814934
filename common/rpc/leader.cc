#include "common/rpc/leader.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/net.h"

namespace ddp {
namespace {

constexpr absl::string_view kNotLeader = "not the leader: ";
constexpr absl::string_view kLeaderAt = "; the leader is at ";

}  // namespace

absl::Status NotLeaderError(const std::string& why, const std::string& leader) {
  return absl::UnavailableError(
      absl::StrCat(kNotLeader, why, leader.empty() ? "" : absl::StrCat(kLeaderAt, leader)));
}

bool IsNotLeader(const absl::Status& status) {
  return absl::IsUnavailable(status) && absl::StartsWith(status.message(), kNotLeader);
}

std::optional<std::string> LeaderNamedIn(const absl::Status& status) {
  if (!IsNotLeader(status)) return std::nullopt;
  const size_t at = status.message().rfind(kLeaderAt);
  if (at == absl::string_view::npos) return std::nullopt;
  std::string leader(status.message().substr(at + kLeaderAt.size()));
  if (!ParseHostPort(leader).ok()) return std::nullopt;
  return leader;
}

absl::StatusOr<std::vector<std::string>> ParseCoordinatorList(const std::string& value) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    const std::string address(absl::StripAsciiWhitespace(part));
    if (address.empty()) continue;
    if (auto parsed = ParseHostPort(address); !parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", address, "' is not HOST:PORT (", parsed.status().message(), ")"));
    }
    out.push_back(address);
  }
  if (out.empty()) return absl::InvalidArgumentError("no coordinator address given (HOST:PORT[,HOST:PORT...])");
  return out;
}

size_t NextCoordinator(const std::vector<std::string>& addresses, size_t current,
                       const absl::Status& status) {
  if (addresses.empty()) return 0;
  if (auto leader = LeaderNamedIn(status)) {
    for (size_t i = 0; i < addresses.size(); ++i) {
      if (addresses[i] == *leader) return i;
    }
  }
  return (current + 1) % addresses.size();
}

}  // namespace ddp
