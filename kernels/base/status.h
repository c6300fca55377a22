// Status: the error value returned across Keel's module boundaries.
// Nothing throws across a public function; a failed call returns a Status whose
// code says what kind of failure it is (callers branch on the code, never on
// the text) and whose message names the field, the value and what is allowed.
#ifndef KEEL_KERNELS_BASE_STATUS_H_
#define KEEL_KERNELS_BASE_STATUS_H_

#include <string>
#include <utility>

namespace keel {

// The kinds of failure, after gRPC's codes of the same names (proto/status_grpc.h
// maps them, in one place).
enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // bad input: a config, a request field, a file's content as given by the user
  kNotFound,            // the record or file asked for does not exist
  kFailedPrecondition,  // valid, but not in this state (a run that already ended, ...)
  kDataLoss,            // stored data is corrupt or truncated (a checkpoint whose CRC fails, ...)
  kUnavailable,         // a peer or resource cannot be reached now; retrying may help
  kInternal,            // anything else: a failed system call, a bug
  kUnimplemented,       // this build lacks the feature (NCCL in a build without CUDA, ...);
                        // last, so the values above keep their numbers (tcp_comm sends them)
};

// "OK", "INVALID_ARGUMENT", ... (gRPC's spelling).
inline const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kInternal: return "INTERNAL";
  }
  return "INTERNAL";
}

class Status {
 public:
  Status() = default;  // OK
  static Status Ok() { return Status(); }
  // A failure without a more precise kind (kInternal).
  static Status Error(std::string message) { return Status(StatusCode::kInternal, std::move(message)); }
  static Status InvalidArgument(std::string message) {
    return Status(StatusCode::kInvalidArgument, std::move(message));
  }
  // Bad input in one field: kInvalidArgument with the message "FIELD: WHAT",
  // and field() names the field (a dotted config path such as "model.heads"),
  // so that a caller can point at it without reading the message.
  static Status InvalidField(std::string field, const std::string& what) {
    Status s(StatusCode::kInvalidArgument, field + ": " + what);
    s.field_ = std::move(field);
    return s;
  }
  static Status NotFound(std::string message) { return Status(StatusCode::kNotFound, std::move(message)); }
  static Status FailedPrecondition(std::string message) {
    return Status(StatusCode::kFailedPrecondition, std::move(message));
  }
  static Status DataLoss(std::string message) { return Status(StatusCode::kDataLoss, std::move(message)); }
  static Status Unavailable(std::string message) { return Status(StatusCode::kUnavailable, std::move(message)); }
  static Status Unimplemented(std::string message) {
    return Status(StatusCode::kUnimplemented, std::move(message));
  }

  // The same failure with `prefix` in front of its message (context for the
  // caller's caller); OK stays OK.
  Status WithPrefix(const std::string& prefix) const {
    return ok() ? *this : Status(code_, prefix + message_, field_);
  }

  // The same failure with another message (a rewording); OK stays OK.
  Status WithMessage(std::string message) const {
    return ok() ? *this : Status(code_, std::move(message), field_);
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // The field an InvalidField failure is about; empty for any other status.
  const std::string& field() const { return field_; }

 private:
  Status(StatusCode code, std::string message, std::string field = std::string())
      : code_(code), message_(std::move(message)), field_(std::move(field)) {
    if (code_ == StatusCode::kOk) code_ = StatusCode::kInternal;  // a failure is never OK
  }
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  std::string field_;
};

}  // namespace keel

// Returns the Status of `expr` from the enclosing function when it failed.
#ifndef KEEL_RETURN_IF_ERROR
#define KEEL_RETURN_IF_ERROR(expr)         \
  do {                                     \
    ::keel::Status _keel_status = (expr);  \
    if (!_keel_status.ok()) return _keel_status; \
  } while (0)
#endif

#endif  // KEEL_KERNELS_BASE_STATUS_H_
