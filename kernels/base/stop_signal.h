// SIGINT and SIGTERM as a stop request, for the long-running programs (keeld,
// keel-worker): their loops poll the flag and shut down in order.
#ifndef KEEL_KERNELS_BASE_STOP_SIGNAL_H_
#define KEEL_KERNELS_BASE_STOP_SIGNAL_H_

#include <atomic>

namespace keel {

// Installs handlers that set the returned flag on SIGINT or SIGTERM (and do
// nothing else, so the program decides how to stop). The flag is process-wide:
// every call returns the same one, and the program may also set it itself.
std::atomic<bool>* StopOnSignals();

}  // namespace keel

#endif  // KEEL_KERNELS_BASE_STOP_SIGNAL_H_
