// Test helpers for plot.h: a synthetic sweep, and a check of a layout's
// geometry.
//
// The synthetic sweep is shaped like the demo's (examples/
// demo-sweep.yaml): precision x seed x policy.max_interventions, loss falling
// from about 5 to 2 over 300 steps, a fault at step 150. Runs of the low
// precisions without a policy blow up (loss 10^2..10^4, then NaN, then a
// stop); with a policy they are rolled back from step 155 to the snapshot at
// 100, switched one rung up and given a smaller learning rate, as keel-train
// records it: the rollback's Event.step is 100 with details from_step 155,
// to_step 100, then switch_precision and scale_lr at step 100. One run is also
// switched by hand (keel intervene) at step 240, and one is rolled back twice.
// Deterministic: the same arguments give the same sweep.
#ifndef KEEL_CLIENT_PLOT_TESTING_H_
#define KEEL_CLIENT_PLOT_TESTING_H_

#include <string>
#include <vector>

#include "client/format.h"
#include "client/plot.h"
#include "proto/keel.pb.h"

namespace keel {
namespace client {

struct SyntheticSweep {
  std::vector<RunSeries> series;
  std::vector<v1::Event> events;  // in the order keeld would store them
};

// `runs` runs (cycling through 5 precisions x 2 seeds x 2 policies), ids
// "run-3", "run-4", ...
SyntheticSweep MakeSyntheticSweep(int runs);

// The steps the policy's rollbacks in MakeSyntheticSweep start from and go
// back to.
constexpr int kSyntheticRollbackFrom = 155;
constexpr int kSyntheticRollbackTo = 100;

// "" when the layout is sound, else its first problem: a text whose box is not
// inside the canvas, two texts whose boxes overlap, a coordinate that is not
// finite, a run's point or a marker outside the chart.
std::string LayoutProblems(const LossPlot& plot);

}  // namespace client
}  // namespace keel

#endif  // KEEL_CLIENT_PLOT_TESTING_H_
