#include "coordinator/http/dashboard_server.h"

#include <civetweb.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/net.h"

namespace ddp {

int DashboardServer::HandleRequest(mg_connection* conn, void* self) {
  const DashboardServer* s = static_cast<const DashboardServer*>(self);
  const mg_request_info* info = mg_get_request_info(conn);
  HttpRequest request;
  request.method = info->request_method ? info->request_method : "";
  // civetweb's local_uri is decoded and cleaned of "." and ".." segments.
  request.path = info->local_uri ? info->local_uri : "/";
  request.query = info->query_string ? info->query_string : "";
  if (const char* a = mg_get_header(conn, "Authorization")) request.authorization = a;
  if (const char* c = mg_get_header(conn, "Cookie")) request.cookie = c;
  const HttpResponse response = s->handler_->Handle(request);
  std::string head = absl::StrCat("HTTP/1.1 ", response.status, " ", HttpReason(response.status),
                                  "\r\nContent-Length: ", response.body.size(),
                                  "\r\nConnection: close\r\n");
  if (!response.content_type.empty()) {
    absl::StrAppend(&head, "Content-Type: ", response.content_type, "\r\n");
  }
  for (const auto& [name, value] : response.headers) absl::StrAppend(&head, name, ": ", value, "\r\n");
  head += "\r\n";
  mg_write(conn, head.data(), head.size());
  if (request.method != "HEAD" && !response.body.empty()) {
    mg_write(conn, response.body.data(), response.body.size());
  }
  return response.status;  // Handled (civetweb logs the status).
}

absl::StatusOr<std::unique_ptr<DashboardServer>> DashboardServer::Start(
    const DashboardServerOptions& options, std::unique_ptr<DashboardHandler> handler) {
  auto parsed = ParseHostPort(options.listen);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--http-listen: ", parsed.status().message()));
  }
  std::unique_ptr<DashboardServer> s(new DashboardServer());
  s->handler_ = std::move(handler);
  mg_init_library(0);
  // No document_root: nothing is served from the disk.
  const std::string ports = parsed->ToString();
  std::vector<const char*> config = {"listening_ports", ports.c_str(),
                                     // An open job page asks twice a second (the job, its output).
                                     "num_threads", "4",
                                     // A client that stalls mid-request is dropped.
                                     "request_timeout_ms", "10000"};
  config.push_back(nullptr);
  mg_callbacks callbacks{};
  // civetweb prints its own errors (a refused bind, a torn request) to stderr; they
  // reach the log through Start's error or not at all.
  callbacks.log_message = [](const mg_connection*, const char*) { return 1; };
  mg_init_data init{};
  init.callbacks = &callbacks;
  init.user_data = s.get();
  init.configuration_options = config.data();
  char error_text[256] = "";
  unsigned error_code = 0;
  mg_error_data error{};
  error.code = &error_code;
  error.text = error_text;
  error.text_buffer_size = sizeof(error_text);
  s->ctx_ = mg_start2(&init, &error);
  if (s->ctx_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve the dashboard on --http-listen ",
                                               options.listen, " (", error_text,
                                               "): is the port taken?"));
  }
  mg_set_request_handler(s->ctx_, "/", &DashboardServer::HandleRequest, s.get());
  mg_server_port bound[4] = {};
  const int n = mg_get_server_ports(s->ctx_, 4, bound);
  if (n < 1 || bound[0].port <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve the dashboard on --http-listen ", options.listen));
  }
  s->port_ = bound[0].port;
  return s;
}

DashboardServer::~DashboardServer() {
  if (ctx_ != nullptr) mg_stop(ctx_);
}

}  // namespace ddp
