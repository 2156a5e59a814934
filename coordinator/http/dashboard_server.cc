#include "coordinator/http/dashboard_server.h"

#include <civetweb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/net.h"

namespace ddp {
namespace {

// OpenSSL's last error as text ("" if none).
std::string SslError() {
  const unsigned long e = ERR_get_error();  // NOLINT(runtime/int): OpenSSL's type.
  if (e == 0) return "";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  return buf;
}

}  // namespace

int DashboardServer::InitSsl(void* ssl_ctx, void* self) {
  auto* s = static_cast<DashboardServer*>(self);
  auto* ctx = static_cast<SSL_CTX*>(ssl_ctx);
  if (SSL_CTX_use_certificate_chain_file(ctx, s->options_.cert_file.c_str()) != 1) {
    s->tls_error_ = absl::StrCat("cannot use --tls-cert ", s->options_.cert_file, ": ", SslError());
    return -1;
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, s->options_.key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    s->tls_error_ = absl::StrCat("cannot use --tls-key ", s->options_.key_file, ": ", SslError());
    return -1;
  }
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  return 1;  // Set up here: civetweb needs no certificate file of its own.
}

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
  request.tls = info->is_ssl != 0;
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
  s->options_ = options;
  s->tls_ = !options.cert_file.empty();
  // civetweb loads OpenSSL when asked to (Debian's build opens libssl.so at run time:
  // the same library the coordinator links, so the SSL_CTX InitSsl gets is ours).
  mg_init_library(s->tls_ ? MG_FEATURES_SSL : 0);
  // "s": this port speaks TLS. No document_root: nothing is served from the disk.
  const std::string ports = absl::StrCat(parsed->ToString(), s->tls_ ? "s" : "");
  std::vector<const char*> config = {"listening_ports", ports.c_str(),
                                     // Browsers poll twice a second per open page.
                                     "num_threads", "4",
                                     // A client that stalls mid-request is dropped.
                                     "request_timeout_ms", "10000"};
  if (s->tls_) {
    config.push_back("ssl_protocol_version");
    config.push_back("4");  // TLS 1.2 and later.
  }
  config.push_back(nullptr);
  mg_callbacks callbacks{};
  callbacks.init_ssl = &DashboardServer::InitSsl;
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
    if (!s->tls_error_.empty()) {
      return absl::UnavailableError(absl::StrCat("--http-listen ", options.listen, ": ",
                                                 s->tls_error_));
    }
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
