// Throughput of GemmCpu (gemm_cpu.h) against the naive k-ordered loop it must
// equal bit for bit, on 1 thread and on every hardware thread, for the four
// transpose combinations the linear layer uses. Prints the configuration and
// the machine first; checks the bits of every run.
//
//   bazel run //kernels:gemm_cpu_bench [-- M N K]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/gemm_cpu.h"

namespace {

std::string CpuModel() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

template <typename F>
double SecondsPerCall(F&& call) {
  call();  // warm-up: page faults, thread start, scratch growth
  int reps = 0;
  auto start = std::chrono::steady_clock::now();
  double elapsed = 0.0;
  do {
    call();
    ++reps;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (elapsed < 1.0);
  return elapsed / reps;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t m = 512, n = 512, k = 2048;
  if (argc == 4) {
    m = std::atoll(argv[1]);
    n = std::atoll(argv[2]);
    k = std::atoll(argv[3]);
  }
  const int all = std::max(1u, std::thread::hardware_concurrency());
  std::printf("GemmCpu: C (%lld x %lld) = A . op(B), K = %lld, fp32; %s, %d hardware threads\n",
              static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
              CpuModel().c_str(), all);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> a(m * k), b(k * n), c(m * n), reference(m * n);
  for (float& v : a) v = normal(rng);
  for (float& v : b) v = normal(rng);
  const double flops = 2.0 * m * n * k;
  const keel::GemmShape shape{m, n, k};

  // Baseline: the naive loop, single-threaded, once per transpose combination.
  for (int variant = 0; variant < 4; ++variant) {
    const bool ta = variant & 1, tb = variant & 2;
    const int64_t lda = ta ? m : k, ldb = tb ? k : n;
    auto start = std::chrono::steady_clock::now();
    keel::GemmNaive(shape, ta, tb, 1.0f, a.data(), lda, b.data(), ldb, false, reference.data(), n);
    double naive = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("  trans_a=%d trans_b=%d  naive loop: %6.2f GFLOP/s\n", ta, tb,
                flops / naive * 1e-9);
    for (int threads : {1, all}) {
      keel::ThreadPool pool(threads);
      double seconds = SecondsPerCall([&] {
        keel::GemmCpu(&pool, shape, ta, tb, 1.0f, a.data(), lda, b.data(), ldb, false, c.data(), n);
      });
      bool same = std::memcmp(c.data(), reference.data(), c.size() * sizeof(float)) == 0;
      std::printf("                     GemmCpu %d thread%s: %6.2f GFLOP/s (%.2f per thread)%s\n",
                  threads, threads == 1 ? " " : "s", flops / seconds * 1e-9,
                  flops / seconds * 1e-9 / threads, same ? "" : "  BITS DIFFER FROM NAIVE");
      if (threads == all) break;
    }
  }
  return 0;
}
