// Argument checks shared by the CPU backend's files (nn_cpu*.cc); not a public
// header. Messages name the operation, the field, the value and what is allowed.
#ifndef KEEL_KERNELS_NN_CPU_INTERNAL_H_
#define KEEL_KERNELS_NN_CPU_INTERNAL_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

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

// CheckMin(op, field, value, 1) for each {field, value}, in order: the first
// failure, or Ok.
inline Status CheckPositive(const char* op,
                            std::initializer_list<std::pair<const char*, int64_t>> fields) {
  for (const auto& f : fields) KEEL_RETURN_IF_ERROR(CheckMin(op, f.first, f.second, 1));
  return Status::Ok();
}

// CheckPtr(op, field, ptr, count) for each {field, ptr}, in order: the first
// failure, or Ok.
inline Status CheckPtrs(const char* op,
                        std::initializer_list<std::pair<const char*, const void*>> fields,
                        int64_t count = 1) {
  for (const auto& f : fields) KEEL_RETURN_IF_ERROR(CheckPtr(op, f.first, f.second, count));
  return Status::Ok();
}

}  // namespace cpu_internal
}  // namespace keel

#endif  // KEEL_KERNELS_NN_CPU_INTERNAL_H_
