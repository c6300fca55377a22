// How clients reach keeld (the keel CLI, keel-worker): plaintext on loopback by
// default, or TLS when given the CA that signed keeld's certificate, optionally
// with a client certificate for keeld's --tls-client-ca.
#ifndef KEEL_PROTO_CHANNEL_H_
#define KEEL_PROTO_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "kernels/status.h"

namespace keel {

struct ChannelOptions {
  std::string address;   // HOST:PORT
  std::string tls_ca;    // PEM file of the CA that signed keeld's certificate ("" : plaintext)
  std::string tls_cert;  // client certificate (PEM), with tls_key
  std::string tls_key;
};

// Errors name the flag-like field (tls_ca, tls_cert, tls_key) and the file.
Status MakeChannel(const ChannelOptions& options, std::shared_ptr<grpc::Channel>* out);

}  // namespace keel

#endif  // KEEL_PROTO_CHANNEL_H_
