#include "coordinator/http/dashboard.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/json_writer.h"
#include "coordinator/http/assets.h"
#include "google/protobuf/util/json_util.h"

namespace ddp {
namespace {

constexpr char kCookie[] = "ddp_token";
constexpr char kJson[] = "application/json; charset=utf-8";
constexpr char kHtml[] = "text/html; charset=utf-8";
// How a refused browser (or script) passes a token, in place of ddpctl's flags.
constexpr char kHowToken[] =
    "log in at /login with a token (a viewer token will do; the dashboard keeps it in a "
    "cookie) or send the header `Authorization: Bearer TOKEN`";
// Output lines a logs request returns by default, and at most.
constexpr int64_t kDefaultTail = 100;
constexpr int64_t kMaxTail = 1000;

std::string ToJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;  // As `ddpctl get -o json` prints them.
  o.always_print_primitive_fields = true;
  std::string s;
  (void)google::protobuf::util::MessageToJsonString(m, &s, o);
  return s;
}

int64_t NowMs(Clock* clock) { return absl::ToUnixMillis(clock->Now()); }

int HttpStatusOf(const absl::Status& st) {
  switch (st.code()) {
    case absl::StatusCode::kInvalidArgument: return 400;
    case absl::StatusCode::kUnauthenticated: return 401;
    case absl::StatusCode::kPermissionDenied: return 403;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kResourceExhausted: return 429;
    case absl::StatusCode::kUnavailable: return 503;
    default: return 500;
  }
}


// The answer to an error: {"error": ...} for the API, a short page for a browser.
// `status` 0: the one that goes with st's code.
// `extra`: HTML added under the message on a page (already escaped).
HttpResponse Error(bool api, const absl::Status& st, int status = 0,
                   const std::string& extra = "") {
  HttpResponse r;
  r.status = status != 0 ? status : HttpStatusOf(st);
  const std::string message(st.message());
  if (api) {
    r.content_type = kJson;
    r.body = JsonObject().Add("error", message).str();
  } else {
    r.content_type = kHtml;
    r.body = absl::StrCat(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>ddp: ", r.status,
        " ", HttpReason(r.status),
        "</title><link rel=\"stylesheet\" href=\"/static/dashboard.css\"></head>\n<body>"
        "<header><a class=\"brand\" href=\"/\">ddp</a></header><main><h2>",
        r.status, " ", HttpReason(r.status), "</h2><div class=\"error\">", HtmlEscape(message),
        "</div>", extra, "</main></body></html>\n");
  }
  if (r.status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"ddp\"");
  return r;
}

HttpResponse Json(std::string body) {
  HttpResponse r;
  r.content_type = kJson;
  r.body = std::move(body);
  return r;
}

HttpResponse Asset(const std::string& name) {
  const EmbeddedAsset* asset = FindAsset(name);
  if (asset == nullptr) {
    return Error(false, absl::NotFoundError(absl::StrCat("no file ", name, " here")));
  }
  HttpResponse r;
  r.content_type = ContentTypeOf(name);
  r.body = std::string(asset->bytes);
  return r;
}

int Hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decoding (and '+' as a space, as forms encode it).
std::string Decode(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() && Hex(s[i + 1]) >= 0 && Hex(s[i + 2]) >= 0) {
      out += static_cast<char>(Hex(s[i + 1]) * 16 + Hex(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// Percent-encodes every byte but unreserved ones (and '/' where `keep_slash`).
std::string Encode(absl::string_view s, bool keep_slash) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kDigits[c >> 4];
      out += kDigits[c & 15];
    }
  }
  return out;
}

// The token in the Cookie header, if the dashboard set one.
std::optional<std::string> CookieToken(const std::string& header) {
  for (absl::string_view part : absl::StrSplit(header, ';')) {
    part = absl::StripAsciiWhitespace(part);
    if (absl::ConsumePrefix(&part, kCookie) && absl::ConsumePrefix(&part, "=")) {
      return Decode(part);
    }
  }
  return std::nullopt;
}

// Whether the query names a token in any spelling (`token=`, `TOKEN`, `%74oken=`):
// such a request is never served with it, nor answered with it.
bool NamesToken(const std::string& query) {
  for (absl::string_view part : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(part, absl::MaxSplits('=', 1));
    if (absl::AsciiStrToLower(absl::StripAsciiWhitespace(Decode(kv.first))) == "token") {
      return true;
    }
  }
  return false;
}

// Where a login may send the browser: a path of this site, without query or fragment
// (which could carry anything back into the address), "/" for anything else: no
// "//host" or "/\\host", which browsers take for another site.
std::string SafeNext(const std::string& next) {
  std::string path = next.substr(0, next.find_first_of("?#"));
  if (path.empty() || path[0] != '/' || (path.size() > 1 && (path[1] == '/' || path[1] == '\\'))) {
    return "/";
  }
  for (char c : path) {
    if (static_cast<unsigned char>(c) < 0x20 || c == '\\') return "/";
  }
  return path;
}

// Whether a POST comes from a page of this dashboard: its Origin, or its Referer
// when a browser sends no Origin, is this scheme and Host. Forms on other sites
// cannot forge either.
bool SameOrigin(const HttpRequest& request) {
  if (request.host.empty()) return false;
  const std::string self =
      absl::AsciiStrToLower(absl::StrCat(request.secure ? "https://" : "http://", request.host));
  if (request.origin.has_value()) return absl::AsciiStrToLower(*request.origin) == self;
  if (request.referer.has_value()) {
    const std::string referer = absl::AsciiStrToLower(*request.referer);
    return referer == self || absl::StartsWith(referer, self + "/");
  }
  return false;
}

std::string LoginLink(const std::string& path) {
  return absl::StrCat("<p><a href=\"/login?next=", HtmlEscape(Encode(SafeNext(path), false)),
                      "\">Log in</a> with a token.</p>");
}

// The login form; `error` (text) above it when a token was refused.
HttpResponse LoginForm(const std::string& next, const std::string& error, int status) {
  HttpResponse r;
  r.status = status;
  r.content_type = kHtml;
  r.body = absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>ddp: log in"
      "</title><link rel=\"stylesheet\" href=\"/static/dashboard.css\"></head>\n<body>"
      "<header><a class=\"brand\" href=\"/\">ddp</a></header><main><h2>Log in</h2>",
      error.empty() ? "" : absl::StrCat("<div class=\"error\">", HtmlEscape(error), "</div>"),
      "<form class=\"login\" method=\"post\" action=\"/login\">"
      "<input type=\"hidden\" name=\"next\" value=\"",
      HtmlEscape(SafeNext(next)),
      "\"><label for=\"token\">Token</label> <input id=\"token\" name=\"token\" "
      "type=\"password\" autocomplete=\"current-password\" required autofocus> "
      "<button type=\"submit\">Log in</button></form>"
      "<p class=\"hint\">Any token of this coordinator but a worker's (a viewer token will "
      "do). The dashboard keeps it in a cookie of this browser until you log out or close "
      "it; scripts send <code>Authorization: Bearer TOKEN</code> instead.</p>"
      "</main></body></html>\n");
  return r;
}

std::string TokenCookie(const std::string& value, bool secure, bool clear) {
  return absl::StrCat(kCookie, "=", value, "; Path=/;", clear ? " Max-Age=0;" : "",
                      " HttpOnly; SameSite=Strict", secure ? "; Secure" : "");
}

// A positive integer parameter, `fallback` when absent, clamped to [1, max].
absl::StatusOr<int64_t> Count(const std::string& query, const std::string& name,
                              int64_t fallback, int64_t max) {
  std::optional<std::string> v = QueryParam(query, name);
  if (!v.has_value()) return fallback;
  int64_t n = 0;
  if (!absl::SimpleAtoi(*v, &n) || n < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be a positive integer (got '", *v, "')"));
  }
  return std::min(n, max);
}

}  // namespace

const char* HttpReason(int status) {
  switch (status) {
    case 200: return "OK";
    case 303: return "See Other";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 429: return "Too Many Requests";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

std::string HtmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::optional<std::string> QueryParam(const std::string& query, const std::string& name) {
  for (absl::string_view part : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(part, absl::MaxSplits('=', 1));
    if (Decode(kv.first) == name) return Decode(kv.second);
  }
  return std::nullopt;
}

absl::StatusOr<Identity> DashboardHandler::Admit(const PresentedCredentials& presented,
                                                 Method method) const {
  return auth_->Authorize(presented, method, /*worker=*/"", kHowToken);
}

HttpResponse DashboardHandler::Handle(const HttpRequest& request) const {
  HttpResponse r;
  const bool api = absl::StartsWith(request.path, "/api/");
  const bool login = request.path == "/login";
  const bool logout = request.path == "/logout";
  if (NamesToken(request.query)) {
    // Tokens travel in the form's body or a header, never in addresses (histories,
    // logs, Referer). The path alone is kept: nothing of the query comes back.
    r.status = 303;
    r.headers.emplace_back("Location", Encode(request.path, true));
  } else if (request.method == "POST" && (login || logout)) {
    r = login ? Login(request) : Logout(request);
  } else if (request.method != "GET" && request.method != "HEAD") {
    r = Error(api,
              absl::InvalidArgumentError(absl::StrCat(
                  "the dashboard is read-only: ", request.method,
                  " is not served (GET and HEAD are, and POST on /login and /logout); use "
                  "ddpctl to change anything")),
              405);
    r.headers.emplace_back("Allow", login ? "GET, HEAD, POST" : logout ? "POST" : "GET, HEAD");
  } else if (absl::StartsWith(request.path, "/static/")) {
    // The pages' CSS and script hold no data: served to anyone, so that a refusal
    // page is styled too.
    r = Asset(request.path.substr(8));
  } else if (login) {
    r = LoginForm(QueryParam(request.query, "next").value_or("/"), "", 200);
  } else if (logout) {
    r = Error(false, absl::InvalidArgumentError("log out with the page's button (a POST)"), 405);
    r.headers.emplace_back("Allow", "POST");
  } else {
    PresentedCredentials presented;
    if (request.authorization.has_value()) {
      presented.authorization = request.authorization;
    } else if (std::optional<std::string> token = CookieToken(request.cookie)) {
      presented.authorization = absl::StrCat("Bearer ", *token);
    }
    r = Route(request, request.path, presented);
  }
  // Every answer: no script, style or connection from anywhere but this origin, no
  // framing, no guessing of content types, nothing cached, nothing referred to other
  // sites. Same-origin, not no-referrer: under no-referrer browsers send `Origin: null`
  // with a form's POST, which the login's origin check must refuse.
  r.headers.emplace_back("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'");
  r.headers.emplace_back("X-Content-Type-Options", "nosniff");
  r.headers.emplace_back("Referrer-Policy", "same-origin");
  r.headers.emplace_back("Cache-Control", "no-store");
  return r;
}

HttpResponse DashboardHandler::Login(const HttpRequest& request) const {
  if (!SameOrigin(request)) {
    return Error(false, absl::PermissionDeniedError(
                            "a login must be posted from this dashboard's own form (its Origin "
                            "or Referer is not this site)"));
  }
  if (!absl::StartsWith(absl::AsciiStrToLower(request.content_type),
                        "application/x-www-form-urlencoded")) {
    return Error(false, absl::InvalidArgumentError(
                            "a login is a form post (application/x-www-form-urlencoded)"));
  }
  const std::string next = QueryParam(request.body, "next").value_or("/");
  const std::string token = QueryParam(request.body, "token").value_or("");
  if (token.empty()) return LoginForm(next, "Enter a token.", 401);
  PresentedCredentials presented;
  presented.authorization = absl::StrCat("Bearer ", token);
  if (auto id = Admit(presented, Method::kListJobs); !id.ok()) {
    return LoginForm(next, std::string(id.status().message()), HttpStatusOf(id.status()));
  }
  HttpResponse r;
  r.status = 303;
  r.headers.emplace_back("Location", Encode(SafeNext(next), true));
  // A coordinator that authenticates no one needs no cookie.
  if (auth_->jobs_authenticated()) {
    r.headers.emplace_back("Set-Cookie",
                           TokenCookie(Encode(token, false), request.secure, /*clear=*/false));
  }
  return r;
}

HttpResponse DashboardHandler::Logout(const HttpRequest& request) const {
  if (!SameOrigin(request)) {
    return Error(false, absl::PermissionDeniedError(
                            "a logout must be posted from this dashboard's own pages (its "
                            "Origin or Referer is not this site)"));
  }
  HttpResponse r;
  r.status = 303;
  r.headers.emplace_back("Location", "/login");
  r.headers.emplace_back("Set-Cookie", TokenCookie("", request.secure, /*clear=*/true));
  return r;
}

HttpResponse DashboardHandler::Route(const HttpRequest& request, const std::string& path,
                                     const PresentedCredentials& presented) const {
  const bool api = absl::StartsWith(path, "/api/");
  auto refuse = [&](const absl::Status& st) {
    return Error(api, st, 0,
                 st.code() == absl::StatusCode::kUnauthenticated ? LoginLink(path) : "");
  };
  auto no_job = [&](const std::string& id) {
    return refuse(absl::NotFoundError(absl::StrCat(
        "job '", id, "' not found: the jobs page (/) lists the jobs the coordinator knows")));
  };

  if (path == "/" || path == "/index.html") {
    auto id = Admit(presented, Method::kListJobs);
    return id.ok() ? Asset("index.html") : refuse(id.status());
  }
  if (absl::StartsWith(path, "/jobs/")) {
    const std::string job_id = path.substr(6);
    auto id = Admit(presented, Method::kGetJob);
    if (!id.ok()) return refuse(id.status());
    if (job_id.empty() || absl::StrContains(job_id, '/')) return no_job(job_id);
    auto job = coordinator_->GetJob(job_id, false, CallerOf(*id));
    if (!job.ok()) {
      return job.status().code() == absl::StatusCode::kNotFound ? no_job(job_id)
                                                                : refuse(job.status());
    }
    return Asset("job.html");
  }
  if (path == "/api/jobs") {
    auto id = Admit(presented, Method::kListJobs);
    if (!id.ok()) return refuse(id.status());
    auto limit = Count(request.query, "limit", 100, 1000);
    if (!limit.ok()) return refuse(limit.status());
    std::vector<std::string> jobs;
    for (const v1::Job& job : coordinator_->ListJobs(static_cast<int>(*limit))) {
      jobs.push_back(ToJson(job));
    }
    return Json(JsonObject().Add("now_ms", NowMs(clock_)).AddRaw("jobs", JsonArray(jobs)).str());
  }
  if (absl::StartsWith(path, "/api/jobs/")) {
    absl::string_view rest = absl::string_view(path).substr(10);
    const bool logs = absl::ConsumeSuffix(&rest, "/logs");
    const std::string job_id(rest);
    if (job_id.empty() || absl::StrContains(job_id, '/')) {
      return refuse(absl::NotFoundError(absl::StrCat("no such API path: ", path)));
    }
    auto id = Admit(presented, logs ? Method::kStreamLogs : Method::kGetJob);
    if (!id.ok()) return refuse(id.status());
    const bool history = QueryParam(request.query, "history").value_or("0") == "1";
    // GetJob applies the redaction of env values for callers who do not own the job.
    auto job = coordinator_->GetJob(job_id, history && !logs, CallerOf(*id));
    if (!job.ok()) {
      return job.status().code() == absl::StatusCode::kNotFound ? no_job(job_id)
                                                                : refuse(job.status());
    }
    if (!logs) {
      return Json(JsonObject().Add("now_ms", NowMs(clock_)).AddRaw("job", ToJson(*job)).str());
    }
    auto tail = Count(request.query, "tail", kDefaultTail, kMaxTail);
    if (!tail.ok()) return refuse(tail.status());
    std::optional<int> rank;
    if (std::optional<std::string> r = QueryParam(request.query, "rank")) {
      int n = 0;
      if (!absl::SimpleAtoi(*r, &n) || n < 0) {
        return refuse(absl::InvalidArgumentError(
            absl::StrCat("rank must be a rank number (got '", *r, "')")));
      }
      rank = n;
    }
    const int64_t after = hub_->TailStart(job_id, rank, *tail);
    std::vector<std::string> lines;
    for (const v1::LogLine& line : hub_->Logs(job_id, after, rank, *tail)) {
      lines.push_back(ToJson(line));
    }
    return Json(
        JsonObject().Add("now_ms", NowMs(clock_)).AddRaw("lines", JsonArray(lines)).str());
  }
  if (path == "/api/workers") {
    auto id = Admit(presented, Method::kListWorkers);
    if (!id.ok()) return refuse(id.status());
    v1::ListWorkersRequest req;  // The first 1,000 workers in name order, and the summary.
    auto workers = coordinator_->ListWorkers(req);
    if (!workers.ok()) return refuse(workers.status());
    std::vector<std::string> items;
    for (const v1::Worker& w : workers->workers()) items.push_back(ToJson(w));
    return Json(JsonObject()
                    .Add("now_ms", NowMs(clock_))
                    .AddRaw("workers", JsonArray(items))
                    .AddRaw("summary", ToJson(workers->summary()))
                    .Add("more", !workers->next_page_token().empty())
                    .str());
  }
  return refuse(absl::NotFoundError(
      absl::StrCat("nothing at ", path, ": the dashboard serves / and /jobs/JOB")));
}

}  // namespace ddp
