// Facts about the machine a program runs on, for the benchmarks that print
// their device and for the tests and benchmarks that start keeld on loopback.
#ifndef KEEL_KERNELS_BASE_HOST_H_
#define KEEL_KERNELS_BASE_HOST_H_

#include <string>

namespace keel {

// The CPU's model name: the value of the first "model name" line of `cpuinfo`
// (Linux's /proc/cpuinfo format), or "unknown CPU" when there is none or the
// file cannot be read.
std::string CpuModel(const std::string& cpuinfo = "/proc/cpuinfo");

// A TCP port on 127.0.0.1 that was free a moment ago (the kernel's pick for a
// socket bound to port 0); another process may take it before the caller
// does. 0 when no socket could be bound.
int FreeLoopbackPort();

}  // namespace keel

#endif  // KEEL_KERNELS_BASE_HOST_H_
