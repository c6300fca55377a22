// Stop requests from signals (stop_signal.h).
#include "kernels/base/stop_signal.h"

#include <signal.h>

namespace keel {
namespace {

std::atomic<bool> g_stop{false};

// Async-signal-safe: a lock-free atomic store.
void OnStopSignal(int) { g_stop.store(true); }

}  // namespace

std::atomic<bool>* StopOnSignals() {
  struct sigaction action = {};
  action.sa_handler = OnStopSignal;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  return &g_stop;
}

}  // namespace keel
