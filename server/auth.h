// Bearer-token authentication of keeld's RPCs. Users and workers hold different
// secrets: user tokens (any number) open KeelService, the worker join token opens
// WorkerService. Every RPC handler calls Authorize first; a missing or wrong
// token gets UNAUTHENTICATED and the handler returns before touching state.
#ifndef KEEL_SERVER_AUTH_H_
#define KEEL_SERVER_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

#include "kernels/base/status.h"

namespace keel {

struct AuthConfig {
  std::vector<std::string> user_tokens;
  std::string worker_token;
};

enum class Caller { kUser, kWorker };

// Reads tokens: user tokens from `user_tokens_file` (one per line, '#' starts a
// comment) and/or $KEEL_USER_TOKENS (comma-separated); the worker token from
// `worker_token_file` or $KEEL_WORKER_TOKEN. When neither gives a token of a
// kind and `state_dir` is not empty, a random 32-byte hex token is generated
// into <state_dir>/user.token or worker.token (mode 0600) and reused on later
// starts. Tokens shorter than 16 characters are refused.
Status LoadAuthConfig(const std::string& user_tokens_file, const std::string& worker_token_file,
                      const std::string& state_dir, AuthConfig* out);

// OK when the call's "authorization" metadata is "Bearer <token>" with a token
// of the needed kind; UNAUTHENTICATED otherwise (the message never echoes the
// token). Comparison is constant-time in the token's length.
grpc::Status Authorize(const grpc::ServerContext& context, const AuthConfig& auth, Caller needed);

// The metadata value clients send: "Bearer " + token.
std::string BearerValue(const std::string& token);

}  // namespace keel

#endif  // KEEL_SERVER_AUTH_H_
