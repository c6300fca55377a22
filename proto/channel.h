// How clients reach keeld (the keel CLI, keel-worker): plaintext on loopback by
// default, or TLS when given the CA that signed keeld's certificate, optionally
// with a client certificate for keeld's --tls-client-ca.
#ifndef KEEL_PROTO_CHANNEL_H_
#define KEEL_PROTO_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "kernels/base/status.h"

namespace keel {

struct ChannelOptions {
  std::string address;   // HOST:PORT
  std::string tls_ca;    // PEM file of the CA that signed keeld's certificate ("" : plaintext)
  std::string tls_cert;  // client certificate (PEM), with tls_key
  std::string tls_key;
};

// Bearer tokens go into gRPC metadata, where gRPC aborts the process on a
// byte outside printable ASCII. CheckToken accepts only 0x21..0x7E; otherwise
// the error is "<origin>: contains a newline at offset N (allowed: printable
// ASCII without spaces)" (or a space, a control character, a byte 0xNN).
// `origin` names where the token came from ("KEEL_TOKEN", "--token-file F").
Status CheckToken(const std::string& token, const std::string& origin);

// Reads a token file (at most 64 KiB), drops one trailing newline ("\n" or
// "\r\n") and checks the rest with CheckToken (origin "--token-file PATH").
Status ReadTokenFile(const std::string& path, std::string* token);

// keeld's addresses as --server (and $KEEL_SERVER, the config's `server`)
// give them: one HOST:PORT, or several separated by commas ("a:7070,b:7070":
// an active keeld and its standbys, tried in order). Surrounding spaces are
// dropped; each item is a gRPC target, used as given. An empty list or item
// is an error naming `origin`, the value and the form allowed; *out is then
// unchanged.
Status ParseServerList(const std::string& value, const std::string& origin, std::vector<std::string>* out);

// Errors name the flag-like field (tls_ca, tls_cert, tls_key) and the file.
Status MakeChannel(const ChannelOptions& options, std::shared_ptr<grpc::Channel>* out);

}  // namespace keel

#endif  // KEEL_PROTO_CHANNEL_H_
