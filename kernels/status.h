// Status: the error value returned across Keel's module boundaries.
// Nothing throws across a public function; a failed call returns a Status whose
// message names the field, the value and what is allowed.
#ifndef KEEL_KERNELS_STATUS_H_
#define KEEL_KERNELS_STATUS_H_

#include <string>
#include <utility>

namespace keel {

class Status {
 public:
  Status() = default;  // OK
  static Status Ok() { return Status(); }
  static Status Error(std::string message) { return Status(std::move(message)); }

  bool ok() const { return !failed_; }
  const std::string& message() const { return message_; }

 private:
  explicit Status(std::string message) : failed_(true), message_(std::move(message)) {}
  bool failed_ = false;
  std::string message_;
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

#endif  // KEEL_KERNELS_STATUS_H_
