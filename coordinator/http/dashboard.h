// The coordinator's read-only web dashboard (`ddp-coordinator --http-listen`).
//
//   GET /                      the jobs (state, owner, priority, age) and the workers
//   GET /jobs/JOB              one job: live rank table, loss and samples/s curves per
//                              rank, attempts with reasons, epochs, the output's tail
//   GET /static/NAME           the pages' CSS and JavaScript (no data; no token needed)
//   GET /login[?next=PATH]     a form for a token; POST /login (token=...&next=PATH)
//                              checks it, sets the cookie and redirects (303) to PATH
//   POST /logout               clears the cookie, redirects to /login
//   GET /api/jobs[?limit=N]            {"now_ms", "jobs": [Job...]}  (ListJobs)
//   GET /api/jobs/JOB[?history=1]      {"now_ms", "job": Job}         (GetJob)
//   GET /api/jobs/JOB/logs[?tail=N][&rank=R]  {"now_ms", "lines": [LogLine...]}
//   GET /api/workers                   {"now_ms", "workers": [...], "summary": {...}}
// The JSON is protobuf's JSON mapping of the messages ddpctl gets (field names as in
// the .proto, `ddpctl get -o json`'s shape); errors are {"error": "..."} (API) or a
// short HTML page, with 400, 401, 403, 404, 405 or 503.
//
// Pages are static files compiled into the binary (assets.h); their script polls the
// API and builds the DOM with textContent only. Every answer carries
// `Content-Security-Policy: default-src 'self'` and `X-Content-Type-Options: nosniff`.
// GET and HEAD everywhere, POST on /login and /logout only (405 otherwise): nothing
// here changes anything but the caller's own cookie. A POST must come from a page of
// this dashboard: its Origin (or, lacking one, its Referer) must be this scheme and
// Host, else 403; with the cookie's SameSite=Strict, another site cannot post a login.
//
// Who may read: the gRPC JobService's read methods' rule, through the same Authorizer
// (auth.h): admin, user and viewer tokens; worker identities get 403, no or unknown
// tokens 401 (a page's 401 links to the login form). A token comes as
// `Authorization: Bearer TOKEN` (scripts) or from the cookie the login form sets:
// HttpOnly, SameSite=Strict, and Secure over HTTPS. A token in the address is never
// taken nor echoed: a request whose query names `token` in any spelling (`TOKEN=`,
// `%74oken=`) is sent to the same path without the query (decision 153). A
// coordinator that authenticates no one (the loopback quickstart) serves everyone.
// GetJob's redaction of `env` values applies as over gRPC: the caller is the same.
//
// DashboardHandler is the logic, request in and response out, with no HTTP server;
// DashboardServer (dashboard_server.h) serves it over HTTP or HTTPS. Thread-safe: the
// handler holds no state of its own, and what it reads is.
#ifndef DDP_COORDINATOR_HTTP_DASHBOARD_H_
#define DDP_COORDINATOR_HTTP_DASHBOARD_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/clock.h"
#include "coordinator/core/coordinator.h"
#include "coordinator/core/event_hub.h"
#include "coordinator/rpc/auth.h"

namespace ddp {

// An HTTP request as the dashboard needs it.
struct HttpRequest {
  std::string method;  // "GET", "HEAD", ...
  std::string path;    // URL-decoded: "/jobs/demo-x1y2z".
  std::string query;   // Still encoded, without '?': "tail=100&rank=1".
  std::optional<std::string> authorization;  // The Authorization header, if any.
  std::string cookie;  // The Cookie header ("" if none).
  std::string content_type;            // Of the body ("" if none).
  std::optional<std::string> origin;   // The Origin header, if any.
  std::optional<std::string> referer;  // The Referer header, if any.
  std::string host;                    // The Host header ("" if none).
  std::string body;                    // POST only; the server limits its size.
  bool secure = false;                 // Came over HTTPS (the cookie is then Secure).
};

struct HttpResponse {
  int status = 200;
  std::string content_type;
  std::string body;
  // Headers beyond Content-Type and Content-Length (the security headers included).
  std::vector<std::pair<std::string, std::string>> headers;
};

class DashboardHandler {
 public:
  // Reads through `coordinator` and `hub`, admits through `auth`; all outlive it.
  DashboardHandler(Coordinator* coordinator, EventHub* hub, const Authorizer* auth,
                   Clock* clock = RealClock())
      : coordinator_(coordinator), hub_(hub), auth_(auth), clock_(clock) {}

  HttpResponse Handle(const HttpRequest& request) const;

 private:
  // The page or API answer for an admitted caller.
  HttpResponse Route(const HttpRequest& request, const std::string& path,
                     const PresentedCredentials& presented) const;
  // The caller's Identity, or the refusal as an answer (JSON for the API).
  absl::StatusOr<Identity> Admit(const PresentedCredentials& presented, Method method) const;
  // POST /login and /logout.
  HttpResponse Login(const HttpRequest& request) const;
  HttpResponse Logout(const HttpRequest& request) const;

  Coordinator* const coordinator_;
  EventHub* const hub_;
  const Authorizer* const auth_;
  Clock* const clock_;
};

// The reason phrase of an HTTP status ("Not Found").
const char* HttpReason(int status);

// What HTML needs escaped (& < > " '), for the server-made error pages.
std::string HtmlEscape(const std::string& text);

// The value of `name` in a URL query ("a=1&b=x%20y"), percent-decoded; nullopt if
// absent.
std::optional<std::string> QueryParam(const std::string& query, const std::string& name);

}  // namespace ddp

#endif  // DDP_COORDINATOR_HTTP_DASHBOARD_H_
