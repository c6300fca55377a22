// Channels to keeld (see channel.h).
#include "proto/channel.h"

#include <fstream>
#include <sstream>

namespace keel {
namespace {

Status ReadPem(const std::string& field, const std::string& path, std::string* out) {
  std::ifstream in(path);
  if (!in) return Status::Error(field + ": cannot read '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  *out = text.str();
  if (out->find("-----BEGIN") == std::string::npos) {
    return Status::Error(field + ": '" + path + "' is not a PEM file");
  }
  return Status::Ok();
}

}  // namespace

Status MakeChannel(const ChannelOptions& options, std::shared_ptr<grpc::Channel>* out) {
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return Status::Error("tls_cert and tls_key: give both or neither");
  }
  if (options.tls_ca.empty()) {
    if (!options.tls_cert.empty()) return Status::Error("tls_cert: needs tls_ca (the CA of keeld's certificate)");
    *out = grpc::CreateChannel(options.address, grpc::InsecureChannelCredentials());
    return Status::Ok();
  }
  grpc::SslCredentialsOptions ssl;
  KEEL_RETURN_IF_ERROR(ReadPem("tls_ca", options.tls_ca, &ssl.pem_root_certs));
  if (!options.tls_cert.empty()) {
    KEEL_RETURN_IF_ERROR(ReadPem("tls_cert", options.tls_cert, &ssl.pem_cert_chain));
    KEEL_RETURN_IF_ERROR(ReadPem("tls_key", options.tls_key, &ssl.pem_private_key));
  }
  *out = grpc::CreateChannel(options.address, grpc::SslCredentials(ssl));
  return Status::Ok();
}

}  // namespace keel
