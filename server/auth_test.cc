// Bearer tokens: generated once and reused, refused when weak, and checked by a
// real gRPC server on loopback (no token, wrong token, the other kind's token:
// UNAUTHENTICATED, and the handler's work does not happen).
#include "server/auth.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdlib>
#include <fstream>

#include "proto/keel.grpc.pb.h"
#include "proto/test_server.h"

namespace keel {
namespace {

std::string FreshDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  EXPECT_EQ(std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str()), 0);
  return dir;
}

TEST(AuthTest, GeneratesTokensOnceWithPrivateModeAndReusesThem) {
  unsetenv("KEEL_USER_TOKENS");
  unsetenv("KEEL_WORKER_TOKEN");
  std::string dir = FreshDir("auth_gen");
  AuthConfig a, b;
  ASSERT_TRUE(LoadAuthConfig("", "", dir, &a).ok());
  ASSERT_EQ(a.user_tokens.size(), 1u);
  EXPECT_EQ(a.user_tokens[0].size(), 64u);
  EXPECT_NE(a.user_tokens[0], a.worker_token);
  struct stat st;
  ASSERT_EQ(stat((dir + "/user.token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_TRUE(LoadAuthConfig("", "", dir, &b).ok());
  EXPECT_EQ(a.user_tokens, b.user_tokens);
  EXPECT_EQ(a.worker_token, b.worker_token);
}

TEST(AuthTest, FilesAndEnvironmentAndRefusals) {
  std::string dir = FreshDir("auth_files");
  std::ofstream(dir + "/users") << "# team tokens\nalice-0123456789abcdef\n\nbob-0123456789abcdef  # bob\n";
  std::ofstream(dir + "/worker") << "worker-0123456789abcdef\n";
  setenv("KEEL_USER_TOKENS", "carol-0123456789abcdef", 1);
  AuthConfig a;
  Status s = LoadAuthConfig(dir + "/users", dir + "/worker", "", &a);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(a.user_tokens, (std::vector<std::string>{"alice-0123456789abcdef", "bob-0123456789abcdef",
                                                     "carol-0123456789abcdef"}));
  EXPECT_EQ(a.worker_token, "worker-0123456789abcdef");
  setenv("KEEL_USER_TOKENS", "short", 1);
  s = LoadAuthConfig("", dir + "/worker", "", &a);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("too short"), std::string::npos) << s.message();
  unsetenv("KEEL_USER_TOKENS");
  s = LoadAuthConfig("", dir + "/worker", "", &a);
  EXPECT_FALSE(s.ok());  // no user token and no state dir to generate one in
  s = LoadAuthConfig(dir + "/missing", dir + "/worker", "", &a);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("missing"), std::string::npos) << s.message();
}

// GetRun behind the user check; counts the calls that got past it.
class GuardedService final : public v1::KeelService::Service {
 public:
  explicit GuardedService(AuthConfig auth) : auth_(std::move(auth)) {}
  grpc::Status GetRun(grpc::ServerContext* context, const v1::GetRunRequest* request, v1::Run* run) override {
    grpc::Status allowed = Authorize(*context, auth_, Caller::kUser);
    if (!allowed.ok()) return allowed;
    ++served;
    run->set_id(request->run_id());
    return grpc::Status::OK;
  }
  std::atomic<int> served{0};

 private:
  AuthConfig auth_;
};

TEST(AuthTest, LoopbackServerRefusesMissingWrongAndWorkerTokens) {
  AuthConfig auth;
  auth.user_tokens = {"user-token-0123456789"};
  auth.worker_token = "worker-token-0123456789";
  GuardedService service(auth);
  const TestServer server = StartTestServer({&service});
  ASSERT_TRUE(server.started());
  auto stub = v1::KeelService::NewStub(grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  auto call = [&](const char* authorization) {
    grpc::ClientContext context;
    if (authorization) context.AddMetadata("authorization", authorization);
    v1::GetRunRequest request;
    request.set_run_id("r1");
    v1::Run run;
    return stub->GetRun(&context, request, &run).error_code();
  };
  EXPECT_EQ(call(nullptr), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call("Bearer wrong-token-0123456789"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call("user-token-0123456789"), grpc::StatusCode::UNAUTHENTICATED);  // no "Bearer "
  EXPECT_EQ(call(BearerValue(auth.worker_token).c_str()), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(service.served.load(), 0);  // nothing happened for the refused calls
  EXPECT_EQ(call(BearerValue(auth.user_tokens[0]).c_str()), grpc::StatusCode::OK);
  EXPECT_EQ(service.served.load(), 1);
  server.server->Shutdown();
}

}  // namespace
}  // namespace keel
