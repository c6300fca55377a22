// For tests that serve a fake or a real service over gRPC: a server on
// 127.0.0.1 without TLS, at a port the kernel picks.
#ifndef KEEL_PROTO_TEST_SERVER_H_
#define KEEL_PROTO_TEST_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <initializer_list>
#include <memory>
#include <string>

namespace keel {

struct TestServer {
  std::unique_ptr<grpc::Server> server;  // null when it did not start
  int port = 0;                          // 0 when it did not start
  bool started() const { return server != nullptr && port > 0; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
};

// Starts a server of `services` (which must outlive it).
inline TestServer StartTestServer(std::initializer_list<grpc::Service*> services) {
  TestServer out;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &out.port);
  for (grpc::Service* service : services) builder.RegisterService(service);
  out.server = builder.BuildAndStart();
  return out;
}

}  // namespace keel

#endif  // KEEL_PROTO_TEST_SERVER_H_
