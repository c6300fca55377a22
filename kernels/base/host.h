// Facts about the machine a program runs on, for the benchmarks that print
// their device and for the tests and benchmarks that start keeld on loopback;
// and the host addresses ranks listen on and publish (dist.listen_host,
// keel-worker --advertise).
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

// Whether `value` can name a host to listen on or connect to: an IPv6 literal
// (without brackets), or at most 253 letters, digits, '.' and '-' not starting
// with '-' (an IPv4 address or a DNS name). Never "host:port".
bool IsHostAddress(const std::string& value);

// "0.0.0.0" and "::": listening there listens on every interface; nothing can
// connect to them.
bool IsWildcardAddress(const std::string& value);

// This machine's address on its route to `host_port` ("host:port" or
// "[v6]:port"): the source address the kernel picks for a UDP socket connected
// there (no packet is sent). The address that host sees this machine at, NAT
// aside. "" when the host does not resolve or no route leads there.
std::string LocalAddressToward(const std::string& host_port);

}  // namespace keel

#endif  // KEEL_KERNELS_BASE_HOST_H_
