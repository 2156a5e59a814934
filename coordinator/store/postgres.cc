#include "coordinator/store/postgres.h"

#include "coordinator/store/postgres_store.h"

#include <cmath>
#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ddp::pg {
namespace {

// libpq's messages span lines ("...failed: Connection refused\n\tIs the server
// running..."): one line for logs and statuses.
std::string OneLine(absl::string_view text) {
  std::string out;
  for (absl::string_view part : absl::StrSplit(text, absl::ByAnyChar("\n\t"), absl::SkipEmpty())) {
    part = absl::StripAsciiWhitespace(part);
    if (part.empty()) continue;
    if (!out.empty()) out.append(" ");
    out.append(part.data(), part.size());
  }
  return out;
}

}  // namespace

Params::Value& Params::At(int i) {
  if (static_cast<int>(values_.size()) < i) values_.resize(static_cast<size_t>(i));
  return values_[static_cast<size_t>(i - 1)];
}

void Params::BindText(int i, const std::string& v) {
  Value& x = At(i);
  x.null = false;
  // PostgreSQL's text holds no NUL byte; a trainer's output may.
  x.text = v.find('\0') == std::string::npos ? v : absl::StrReplaceAll(v, {{std::string(1, '\0'), ""}});
}

void Params::BindInt(int i, int64_t v) {
  Value& x = At(i);
  x.null = false;
  x.text = absl::StrCat(v);
}

void Params::BindReal(int i, double v) {
  Value& x = At(i);
  x.null = std::isnan(v);
  x.text = std::isinf(v) ? (v > 0 ? "Infinity" : "-Infinity") : absl::StrFormat("%.17g", v);
}

std::vector<const char*> Params::Pointers() const {
  std::vector<const char*> out;
  out.reserve(values_.size());
  for (const Value& v : values_) out.push_back(v.null ? nullptr : v.text.c_str());
  return out;
}

int64_t Result::Int(int col) const {
  int64_t v = 0;
  if (!Null(col)) (void)absl::SimpleAtoi(PQgetvalue(res_.get(), row_, col), &v);
  return v;
}

double Result::Real(int col) const {
  if (Null(col)) return std::nan("");
  return std::strtod(PQgetvalue(res_.get(), row_, col), nullptr);  // Also NaN, Infinity.
}

std::string Result::Text(int col) const {
  return std::string(PQgetvalue(res_.get(), row_, col),
                     static_cast<size_t>(PQgetlength(res_.get(), row_, col)));
}

int64_t Result::Affected() const {
  int64_t n = 0;
  (void)absl::SimpleAtoi(PQcmdTuples(res_.get()), &n);
  return n;
}

Conn::Conn(std::string uri, std::string session_sql)
    : uri_(std::move(uri)), session_sql_(std::move(session_sql)) {}

Conn::~Conn() { PQfinish(conn_); }

std::string Conn::Describe() const {
  PQconninfoOption* opts = PQconninfoParse(uri_.c_str(), nullptr);
  if (opts == nullptr) return "postgresql";
  std::string host = "localhost", port = "5432", db;
  for (PQconninfoOption* o = opts; o->keyword != nullptr; ++o) {
    if (o->val == nullptr) continue;
    const std::string k = o->keyword;
    if (k == "host" || k == "hostaddr") host = o->val;
    if (k == "port") port = o->val;
    if (k == "dbname") db = o->val;
  }
  PQconninfoFree(opts);
  return absl::StrCat(host, ":", port, db.empty() ? "" : "/", db);
}

absl::Status Conn::Connect() {
  if (conn_ != nullptr && PQstatus(conn_) == CONNECTION_OK) return absl::OkStatus();
  PQfinish(conn_);
  // Defaults first: the URI, expanded after them, overrides what it sets itself. A
  // server that goes silent (a partition, a dead host) fails a call within seconds
  // (unacknowledged data: tcp_user_timeout; an idle connection: keepalives) instead of
  // when TCP gives up, minutes later.
  const char* keys[] = {"connect_timeout", "application_name", "tcp_user_timeout",
                        "keepalives",      "keepalives_idle",  "keepalives_interval",
                        "keepalives_count", "dbname",          nullptr};
  const char* values[] = {"3", "ddp-coordinator", "3000", "1", "1", "1", "3",
                          uri_.c_str(), nullptr};
  conn_ = PQconnectdbParams(keys, values, /*expand_dbname=*/1);
  if (conn_ == nullptr || PQstatus(conn_) != CONNECTION_OK) {
    std::string msg = conn_ != nullptr ? PQerrorMessage(conn_) : "out of memory";
    PQfinish(conn_);
    conn_ = nullptr;
    return absl::UnavailableError(
        absl::StrCat("cannot reach the PostgreSQL store at ", Describe(), ": ", OneLine(msg)));
  }
  if (!session_sql_.empty()) {
    PGresult* res = PQexec(conn_, session_sql_.c_str());
    absl::Status st = ErrorOf(res, session_sql_);
    PQclear(res);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status Conn::ErrorOf(PGresult* res, const std::string& sql) {
  const ExecStatusType status = res != nullptr ? PQresultStatus(res) : PGRES_FATAL_ERROR;
  if (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK) return absl::OkStatus();
  std::string msg = OneLine(res != nullptr ? PQresultErrorMessage(res) : PQerrorMessage(conn_));
  if (msg.empty()) msg = OneLine(PQerrorMessage(conn_));
  const char* state = res != nullptr ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : nullptr;
  const std::string sqlstate = state != nullptr ? state : "";
  if (PQstatus(conn_) != CONNECTION_OK || absl::StartsWith(sqlstate, "08") ||
      absl::StartsWith(sqlstate, "57P")) {  // Connection exceptions; admin shutdown.
    PQfinish(conn_);
    conn_ = nullptr;
    return absl::UnavailableError(
        absl::StrCat("lost the PostgreSQL store at ", Describe(), ": ", msg));
  }
  if (sqlstate == "40001" || sqlstate == "40P01" || sqlstate == "55P03" || sqlstate == "57014") {
    // Serialization failure, deadlock, lock not available, statement timeout.
    return absl::FailedPreconditionError(absl::StrCat("postgresql: ", msg));
  }
  return absl::InternalError(
      absl::StrCat("postgresql: ", msg, " (SQLSTATE ", sqlstate, ") in: ", sql.substr(0, 200)));
}

absl::StatusOr<Result> Conn::Exec(const std::string& sql, const Params& params) {
  if (absl::Status st = Connect(); !st.ok()) return st;
  const std::vector<const char*> values = params.Pointers();
  PGresult* res = PQexecParams(conn_, sql.c_str(), params.size(), nullptr, values.data(), nullptr,
                               nullptr, /*resultFormat=*/0);
  if (absl::Status st = ErrorOf(res, sql); !st.ok()) {
    PQclear(res);
    return st;
  }
  return Result(res);
}

absl::Status Conn::ExecScript(const std::string& sql) {
  if (absl::Status st = Connect(); !st.ok()) return st;
  PGresult* res = PQexec(conn_, sql.c_str());
  absl::Status st = ErrorOf(res, sql);
  PQclear(res);
  return st;
}

std::string Redact(const std::string& uri) {
  std::string out = uri;
  const size_t scheme = out.find("://");
  const size_t at = out.find('@', scheme == std::string::npos ? 0 : scheme + 3);
  if (scheme != std::string::npos && at != std::string::npos) {
    const size_t colon = out.find(':', scheme + 3);
    if (colon != std::string::npos && colon < at) out.replace(colon + 1, at - colon - 1, "***");
  }
  const size_t pw = out.find("password=");
  if (pw != std::string::npos) {
    const size_t end = out.find_first_of("& ", pw);
    out.replace(pw + 9, (end == std::string::npos ? out.size() : end) - pw - 9, "***");
  }
  return out;
}

absl::Status CheckUri(const std::string& uri) {
  if (!absl::StartsWith(uri, "postgresql://") && !absl::StartsWith(uri, "postgres://")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--store ", Redact(uri),
        ": not a PostgreSQL URI (postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE)"));
  }
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(uri.c_str(), &err);
  if (opts == nullptr) {
    std::string msg = err != nullptr ? err : "cannot parse it";
    PQfreemem(err);
    return absl::InvalidArgumentError(
        absl::StrCat("--store ", Redact(uri), ": ", absl::StripAsciiWhitespace(msg)));
  }
  std::string bad_port;
  for (PQconninfoOption* o = opts; o->keyword != nullptr; ++o) {
    if (std::string(o->keyword) != "port" || o->val == nullptr) continue;
    for (absl::string_view part : absl::StrSplit(o->val, ',')) {
      int port = 0;
      if (!absl::SimpleAtoi(part, &port) || port < 1 || port > 65535) bad_port = std::string(part);
    }
  }
  PQconninfoFree(opts);
  if (!bad_port.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--store ", Redact(uri), ": the port '",
                                                   bad_port, "' is not a number from 1 to 65535"));
  }
  return absl::OkStatus();
}

}  // namespace ddp::pg
