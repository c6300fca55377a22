// Status codes: each constructor gives its code, a failure is never OK, and
// code names follow gRPC's spelling.
#include "kernels/base/status.h"

#include <gtest/gtest.h>

namespace keel {
namespace {

TEST(StatusTest, ConstructorsGiveTheirCodes) {
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status::Ok().code(), StatusCode::kOk);
  EXPECT_EQ(Status::Error("x").code(), StatusCode::kInternal);
  EXPECT_EQ(Status::InvalidArgument("x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Status::NotFound("x").code(), StatusCode::kNotFound);
  EXPECT_EQ(Status::FailedPrecondition("x").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Status::DataLoss("x").code(), StatusCode::kDataLoss);
  EXPECT_EQ(Status::Unavailable("x").code(), StatusCode::kUnavailable);
  EXPECT_EQ(Status::Unimplemented("x").code(), StatusCode::kUnimplemented);
  for (const Status& s : {Status::Error(""), Status::NotFound(""), Status::DataLoss("")}) EXPECT_FALSE(s.ok());
  EXPECT_EQ(Status::NotFound("run 'r' not found").message(), "run 'r' not found");
}

TEST(StatusTest, TheCodeNotTheTextSaysWhatFailed) {
  // A message that reads like a missing record is still what its code says.
  EXPECT_EQ(Status::Error("sweep 's' not found").code(), StatusCode::kInternal);
  EXPECT_STREQ(StatusCodeName(StatusCode::kDataLoss), "DATA_LOSS");
  // Context added on the way up keeps the code.
  Status up = Status::NotFound("run 'r'").WithPrefix("GetRun: ");
  EXPECT_EQ(up.code(), StatusCode::kNotFound);
  EXPECT_EQ(up.message(), "GetRun: run 'r'");
  EXPECT_TRUE(Status::Ok().WithPrefix("x: ").ok());
  Status reworded = Status::DataLoss("a\nb").WithMessage("a b");
  EXPECT_EQ(reworded.code(), StatusCode::kDataLoss);
  EXPECT_EQ(reworded.message(), "a b");
  EXPECT_STREQ(StatusCodeName(StatusCode::kInvalidArgument), "INVALID_ARGUMENT");
  EXPECT_STREQ(StatusCodeName(StatusCode::kUnimplemented), "UNIMPLEMENTED");
}

TEST(StatusTest, InvalidFieldNamesItsFieldThroughRewordings) {
  Status s = Status::InvalidField("model.heads", "5 does not divide model.width 64");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "model.heads: 5 does not divide model.width 64");
  EXPECT_EQ(s.field(), "model.heads");
  EXPECT_EQ(s.WithPrefix("run.yaml:3:9: ").field(), "model.heads");
  EXPECT_EQ(s.WithMessage("one line").field(), "model.heads");
  EXPECT_EQ(Status::InvalidArgument("model.heads: 5").field(), "");
  EXPECT_EQ(Status::Ok().field(), "");
}

}  // namespace
}  // namespace keel
