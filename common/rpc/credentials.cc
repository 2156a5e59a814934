#include "common/rpc/credentials.h"

#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <grpcpp/support/client_interceptor.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/net.h"

namespace ddp {
namespace {

using X509Ptr = std::unique_ptr<X509, decltype(&X509_free)>;
using KeyPtr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;
using BioPtr = std::unique_ptr<BIO, decltype(&BIO_free)>;

absl::StatusOr<std::string> ReadFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

BioPtr MemBio(const std::string& text) {
  return BioPtr(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())), &BIO_free);
}

// Every certificate in a PEM file; at least one, each currently valid.
absl::StatusOr<std::vector<X509Ptr>> LoadCertificates(const std::string& flag,
                                                      const std::string& path) {
  auto text = ReadFile(flag, path);
  if (!text.ok()) return text.status();
  BioPtr bio = MemBio(*text);
  std::vector<X509Ptr> certs;
  while (X509* c = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    certs.emplace_back(c, &X509_free);
  }
  if (certs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path, " holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
  }
  for (const X509Ptr& c : certs) {
    if (X509_cmp_current_time(X509_get0_notAfter(c.get())) < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": the certificate in ", path,
                       " has expired: make a new one (scripts/make_certs.sh)"));
    }
    if (X509_cmp_current_time(X509_get0_notBefore(c.get())) > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": the certificate in ", path, " is not valid yet: is this machine's clock right?"));
    }
  }
  return certs;
}

// A certificate and its private key, checked to be a pair.
absl::Status CheckIdentity(const std::string& cert_flag, const std::string& cert_file,
                           const std::string& key_flag, const std::string& key_file) {
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(cert_flag, " and ", key_flag, " go together: give both or neither"));
  }
  if (cert_file.empty()) return absl::OkStatus();
  auto certs = LoadCertificates(cert_flag, cert_file);
  if (!certs.ok()) return certs.status();
  auto key_text = ReadFile(key_flag, key_file);
  if (!key_text.ok()) return key_text.status();
  BioPtr bio = MemBio(*key_text);
  KeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr), &EVP_PKEY_free);
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        key_flag, ": ", key_file, " holds no unencrypted PEM private key"));
  }
  if (X509_check_private_key(certs->front().get(), key.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(key_flag, ": ", key_file,
                                                   " is not the private key of ", cert_file));
  }
  return absl::OkStatus();
}

// Adds `authorization: Bearer <token>` to every call of a channel.
class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(std::shared_ptr<const std::string> header)
      : header_(std::move(header)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", *header_});
    }
    methods->Proceed();
  }

 private:
  std::shared_ptr<const std::string> header_;
};

class BearerTokenFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenFactory(const std::string& token)
      : header_(std::make_shared<const std::string>("Bearer " + token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerTokenInterceptor(header_);
  }

 private:
  std::shared_ptr<const std::string> header_;
};

unsigned RefreshSeconds(absl::Duration d) {
  return static_cast<unsigned>(std::max<int64_t>(1, absl::ToInt64Seconds(d)));
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsOptions& o) {
  if (o.cert_file.empty() && o.key_file.empty()) {
    if (!o.ca_file.empty()) {
      return absl::InvalidArgumentError(
          "--tls-ca needs --tls-cert and --tls-key: client certificates are checked only over TLS");
    }
    return grpc::InsecureServerCredentials();
  }
  if (absl::Status st = CheckIdentity("--tls-cert", o.cert_file, "--tls-key", o.key_file);
      !st.ok()) {
    return st;
  }
  if (!o.ca_file.empty()) {
    if (auto ca = LoadCertificates("--tls-ca", o.ca_file); !ca.ok()) return ca.status();
  }
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      o.key_file, o.cert_file, o.ca_file, RefreshSeconds(o.refresh));
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (o.ca_file.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    // Optional but verified: workers present one, ddpctl (tokens) does not.
    options.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const ChannelSecurity& s,
                                                           grpc::ChannelArguments args) {
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (s.ca_file.empty()) {
    if (!s.cert_file.empty() || !s.key_file.empty()) {
      return absl::InvalidArgumentError(
          "--tls-cert and --tls-key need --tls-ca (the CA that signed the coordinator's "
          "certificate)");
    }
    auto hp = ParseHostPort(target);
    if (!s.token.empty() && (!hp.ok() || !IsLoopbackHost(hp->host))) {
      return absl::FailedPreconditionError(absl::StrCat(
          "refusing to send a token in plaintext to ", target,
          ": give the coordinator's CA with --tls-ca (or DDP_TLS_CA) to use TLS"));
    }
    creds = grpc::InsecureChannelCredentials();
  } else {
    if (absl::Status st = CheckIdentity("--tls-cert", s.cert_file, "--tls-key", s.key_file);
        !st.ok()) {
      return st;
    }
    if (auto ca = LoadCertificates("--tls-ca", s.ca_file); !ca.ok()) return ca.status();
    auto provider =
        s.cert_file.empty()
            ? std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                  s.ca_file, RefreshSeconds(s.refresh))
            : std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                  s.key_file, s.cert_file, s.ca_file, RefreshSeconds(s.refresh));
    grpc::experimental::TlsChannelCredentialsOptions options;
    options.set_certificate_provider(provider);
    options.watch_root_certs();
    if (!s.cert_file.empty()) options.watch_identity_key_cert_pairs();
    options.set_verify_server_certs(true);
    options.set_certificate_verifier(
        std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
    options.set_check_call_host(true);
    creds = grpc::experimental::TlsCredentials(options);
    if (!s.server_name.empty()) args.SetSslTargetNameOverride(s.server_name);
  }
  if (creds == nullptr) return absl::InternalError("gRPC could not make the channel credentials");
  if (s.token.empty()) return grpc::CreateCustomChannel(target, creds, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> chain;
  chain.push_back(std::make_unique<BearerTokenFactory>(s.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, creds, args,
                                                                 std::move(chain));
}

absl::StatusOr<std::string> CertificateCommonName(const std::string& path) {
  auto certs = LoadCertificates("--tls-cert", path);
  if (!certs.ok()) return certs.status();
  X509_NAME* subject = X509_get_subject_name(certs->front().get());
  char buf[256] = {};
  if (X509_NAME_get_text_by_NID(subject, NID_commonName, buf, sizeof(buf)) < 0) return "";
  return std::string(buf);
}

}  // namespace ddp
