// keel.proto builds into working C++: messages round-trip through the wire
// format, and the generated service stubs talk over a real gRPC server on
// loopback (the services themselves are keeld's, next to this test's scope).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "proto/gpu_share.h"
#include "proto/keel.grpc.pb.h"
#include "proto/keel.pb.h"
#include "proto/test_server.h"

namespace keel {
namespace {

TEST(KeelProtoTest, GpuShareTextHasNoTrailingZeros) {
  EXPECT_EQ(GpuShareText(250), "0.25");
  EXPECT_EQ(GpuShareText(500), "0.5");
  EXPECT_EQ(GpuShareText(1), "0.001");
  EXPECT_EQ(GpuShareText(125), "0.125");
  EXPECT_EQ(GpuShareText(1000), "1");
  EXPECT_EQ(GpuShareText(1250), "1.25");
}

TEST(KeelProtoTest, RunRoundTripsThroughTheWireFormat) {
  v1::Run run;
  run.set_id("run-1");
  run.set_state(v1::RUNNING);
  run.mutable_spec()->set_yaml("model: {type: proxy}\n");
  (*run.mutable_axes())["optimizer.lr"] = "6e-4";
  run.set_loss(0.0023);
  std::string wire;
  ASSERT_TRUE(run.SerializeToString(&wire));
  v1::Run back;
  ASSERT_TRUE(back.ParseFromString(wire));
  EXPECT_EQ(back.id(), "run-1");
  EXPECT_EQ(back.state(), v1::RUNNING);
  EXPECT_EQ(back.spec().yaml(), "model: {type: proxy}\n");
  EXPECT_EQ(back.axes().at("optimizer.lr"), "6e-4");
  EXPECT_DOUBLE_EQ(back.loss(), 0.0023);
  EXPECT_EQ(v1::RunState_Name(v1::DIVERGED), "DIVERGED");
}

// Answers GetRun with the id it was asked for; every other method is the
// generated UNIMPLEMENTED.
class EchoRunService final : public v1::KeelService::Service {
  grpc::Status GetRun(grpc::ServerContext*, const v1::GetRunRequest* request, v1::Run* run) override {
    if (request->run_id().empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "run_id: empty");
    run->set_id(request->run_id());
    run->set_state(v1::QUEUED);
    return grpc::Status::OK;
  }
};

TEST(KeelProtoTest, GeneratedStubsTalkOverLoopback) {
  EchoRunService service;
  const TestServer server = StartTestServer({&service});
  ASSERT_NE(server.server, nullptr);
  ASSERT_GT(server.port, 0);
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::KeelService::NewStub(channel);

  grpc::ClientContext ok_context;
  v1::GetRunRequest request;
  request.set_run_id("run-7");
  v1::Run run;
  grpc::Status status = stub->GetRun(&ok_context, request, &run);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(run.id(), "run-7");
  EXPECT_EQ(run.state(), v1::QUEUED);

  grpc::ClientContext bad_context;
  request.clear_run_id();
  status = stub->GetRun(&bad_context, request, &run);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  grpc::ClientContext unimplemented_context;
  v1::ListSweepsResponse sweeps;
  status = stub->ListSweeps(&unimplemented_context, v1::ListSweepsRequest(), &sweeps);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  server.server->Shutdown();
}

}  // namespace
}  // namespace keel
