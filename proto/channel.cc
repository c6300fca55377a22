// Channels to keeld (see channel.h).
#include "proto/channel.h"

#include <algorithm>

#include <cerrno>
#include <cstdio>
#include <cstring>
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

Status CheckToken(const std::string& token, const std::string& origin) {
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c >= 0x21 && c <= 0x7E) continue;
    std::string what;
    if (c == '\n' || c == '\r') {
      what = "a newline";
    } else if (c == ' ') {
      what = "a space";
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02X", c);
      what = (c < 0x20 || c == 0x7F ? std::string("a control character ") : std::string("byte ")) + hex;
    }
    return Status::Error(origin + ": contains " + what + " at offset " + std::to_string(i) +
                         " (allowed: printable ASCII without spaces)");
  }
  return Status::Ok();
}

Status ReadTokenFile(const std::string& path, std::string* token) {
  const std::string origin = "--token-file " + path;
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(origin + ": cannot read: " + std::strerror(errno));
  const size_t kMaxTokenFile = 64 << 10;  // a token is tens of bytes; never read a device to its end
  std::string text(kMaxTokenFile + 1, '\0');
  in.read(&text[0], static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxTokenFile) return Status::Error(origin + ": more than 65536 bytes (allowed: one token)");
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (!text.empty() && text.back() == '\r') text.pop_back();
  KEEL_RETURN_IF_ERROR(CheckToken(text, origin));
  *token = text;
  return Status::Ok();
}

Status ParseServerList(const std::string& value, const std::string& origin, std::vector<std::string>* out) {
  const std::string allowed = " (allowed: HOST:PORT, or several separated by commas: the active keeld's and its "
                              "standbys', tried in order)";
  std::vector<std::string> servers;
  size_t begin = 0;
  for (;;) {
    const size_t end = std::min(value.find(',', begin), value.size());
    std::string item = value.substr(begin, end - begin);
    const size_t first = item.find_first_not_of(' ');
    item = first == std::string::npos ? "" : item.substr(first, item.find_last_not_of(' ') - first + 1);
    if (item.empty()) return Status::InvalidArgument(origin + ": '" + value + "' has an empty address" + allowed);
    servers.push_back(item);
    if (end == value.size()) break;
    begin = end + 1;
  }
  *out = std::move(servers);
  return Status::Ok();
}

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
