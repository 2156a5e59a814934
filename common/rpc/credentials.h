// TLS and token credentials for every gRPC channel in ddp, in one place.
//
// Server: MakeServerCredentials() serves TLS from a certificate and key, re-read by
// gRPC's file watcher whenever they change on disk (checked every `refresh`), so a
// rotated certificate needs no restart. With a CA it also asks each client for a
// certificate and verifies any it presents against that CA
// (REQUEST_CLIENT_CERTIFICATE_AND_VERIFY): workers prove who they are with one,
// while ddpctl, which carries none, still connects and authenticates by token on the
// same port.
//
// Client: MakeChannel() builds a TLS channel when given a CA (optionally presenting a
// client certificate: ddp-worker), plaintext otherwise, and sends the bearer token, if
// any, as `authorization: Bearer ...` on every call through an interceptor. It
// refuses to send a token in plaintext anywhere but loopback.
//
// Every file is read and checked when the credentials are made, so a missing file, a
// key that does not match its certificate or an expired certificate is a clear error
// at start rather than a failed handshake later.
#ifndef DDP_COMMON_RPC_CREDENTIALS_H_
#define DDP_COMMON_RPC_CREDENTIALS_H_

#include <grpcpp/channel.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ddp {

struct ServerTlsOptions {
  std::string cert_file;  // --tls-cert: PEM chain. Empty: plaintext.
  std::string key_file;   // --tls-key
  std::string ca_file;    // --tls-ca: verify client certificates against it.
  absl::Duration refresh = absl::Seconds(10);  // How often the files are re-read.
};

// Plaintext when cert_file is empty. INVALID_ARGUMENT naming the flag and the file
// for anything unusable (unreadable, not PEM, key and certificate not a pair, expired).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsOptions& options);

struct ChannelSecurity {
  std::string ca_file;    // --tls-ca: TLS, verifying the server against this CA.
  std::string cert_file;  // --tls-cert / --tls-key: a client certificate (mTLS).
  std::string key_file;
  // The name the server's certificate must carry, when it differs from the target's
  // host (gRPC's ssl_target_name_override). Empty: the target's host.
  std::string server_name;
  std::string token;      // Sent as `authorization: Bearer <token>`; empty: none.
  absl::Duration refresh = absl::Seconds(10);
};

// A channel to `target` (HOST:PORT). INVALID_ARGUMENT for unusable files (naming the
// flag), FAILED_PRECONDITION for a token over plaintext to a non-loopback host.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const ChannelSecurity& security,
                                                           grpc::ChannelArguments args = {});

// The subject common name of the first certificate in a PEM file ("" if none).
absl::StatusOr<std::string> CertificateCommonName(const std::string& path);

}  // namespace ddp

#endif  // DDP_COMMON_RPC_CREDENTIALS_H_
