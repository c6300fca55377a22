// Test data: byte-level llm.c shards <dir>/<prefix>_{train,val}.bin of real
// English text from the Debian package fortunes (installed by
// scripts/install-deps), for the trainer's GPT tests.
#ifndef KEEL_WORKER_ENGINE_FORTUNES_SHARDS_H_
#define KEEL_WORKER_ENGINE_FORTUNES_SHARDS_H_

#include <string>

namespace keel {

// Writes the shards; fails the calling test (gtest assertions) when the
// package is missing or the shards cannot be written.
void PrepareFortunes(const std::string& dir, const std::string& prefix);

}  // namespace keel

#endif  // KEEL_WORKER_ENGINE_FORTUNES_SHARDS_H_
