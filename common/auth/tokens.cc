#include "common/auth/tokens.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ddp {

const char* RoleName(Role role) {
  switch (role) {
    case Role::kAdmin: return "admin";
    case Role::kUser: return "user";
    case Role::kViewer: return "viewer";
    case Role::kWorker: return "worker";
  }
  return "?";
}

std::optional<Role> ParseRole(absl::string_view name) {
  for (Role r : {Role::kAdmin, Role::kUser, Role::kViewer, Role::kWorker}) {
    if (name == RoleName(r)) return r;
  }
  return std::nullopt;
}

absl::Status CheckTokenSyntax(absl::string_view token) {
  if (token.size() < 16) {
    return absl::InvalidArgumentError(
        "a token must be at least 16 characters (scripts/make_certs.sh makes 43)");
  }
  if (token.size() > 4096) return absl::InvalidArgumentError("a token is at most 4096 characters");
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          "a token is printable ASCII without spaces or control characters");
    }
  }
  return absl::OkStatus();
}

TokenTable::Digest TokenTable::Sha256(absl::string_view text) {
  Digest d;
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), d.data());
  return d;
}

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view text, absl::string_view source) {
  TokenTable table;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    auto fail = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_no, ": ", what));
    };
    if (fields.size() < 2 || fields.size() > 3) {
      return fail("expected `token role [name]`");
    }
    if (absl::Status st = CheckTokenSyntax(fields[0]); !st.ok()) return fail(st.message());
    std::optional<Role> role = ParseRole(fields[1]);
    if (!role.has_value()) {
      return fail(absl::StrCat("unknown role '", fields[1],
                               "' (roles: admin, user, viewer, worker)"));
    }
    Identity id;
    id.role = *role;
    id.via = "token";
    id.name = fields.size() == 3 ? std::string(fields[2]) : RoleName(*role);
    if (*role == Role::kWorker && fields.size() < 3) {
      return fail("a worker token needs the worker's name: `token worker NAME`");
    }
    Digest digest = Sha256(fields[0]);
    for (const Entry& e : table.entries_) {
      if (e.digest == digest) return fail("this token is already listed on an earlier line");
    }
    table.entries_.push_back({digest, std::move(id)});
  }
  return table;
}

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read token file ", path));
  std::stringstream buf;
  buf << in.rdbuf();
  return Parse(buf.str(), path);
}

std::optional<Identity> TokenTable::Find(absl::string_view token) const {
  const Digest digest = Sha256(token);
  const Entry* found = nullptr;
  for (const Entry& e : entries_) {
    // No early exit: every entry costs the same, matched or not.
    const bool match = CRYPTO_memcmp(e.digest.data(), digest.data(), digest.size()) == 0;
    if (match) found = &e;
  }
  if (found == nullptr) return std::nullopt;
  return found->identity;
}

bool TokenTable::HasRole(Role role) const {
  for (const Entry& e : entries_) {
    if (e.identity.role == role) return true;
  }
  return false;
}

absl::StatusOr<std::string> ReadClientToken(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read token file ", path));
  std::stringstream buf;
  buf << in.rdbuf();
  std::string token(absl::StripAsciiWhitespace(buf.str()));
  if (absl::Status st = CheckTokenSyntax(token); !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", path, ": ", st.message(), " (the file holds the token alone)"));
  }
  return token;
}

}  // namespace ddp
