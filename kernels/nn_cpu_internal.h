// Argument checks shared by the CPU backend's files (nn_cpu*.cc); not a public
// header. Messages name the operation, the field, the value and what is allowed.
#ifndef KEEL_KERNELS_NN_CPU_INTERNAL_H_
#define KEEL_KERNELS_NN_CPU_INTERNAL_H_

#include <cstdint>
#include <string>

#include "kernels/base/status.h"

namespace keel {
namespace cpu_internal {

inline Status CheckMin(const char* op, const char* field, int64_t value, int64_t min) {
  if (value >= min) return Status::Ok();
  return Status::Error(std::string(op) + ": " + field + ": " + std::to_string(value) +
                       " is not allowed; need >= " + std::to_string(min));
}

// A null pointer is an error unless `count` elements are zero (nothing to touch).
inline Status CheckPtr(const char* op, const char* field, const void* ptr, int64_t count = 1) {
  if (ptr != nullptr || count == 0) return Status::Ok();
  return Status::Error(std::string(op) + ": " + field +
                       ": null is not allowed; pass backend memory");
}

}  // namespace cpu_internal
}  // namespace keel

#endif  // KEEL_KERNELS_NN_CPU_INTERNAL_H_
