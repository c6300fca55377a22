// Gradient buckets (issue 13, data-parallel ranks): the flat gradient reduced
// over the ranks in pieces, each piece as soon as the backward has written it
// for good, so that communication overlaps the rest of the backward.
//
// The plan: every parameter tensor owns a slot of the flat gradient, from its
// offset to the next tensor's (the alignment padding goes with it; the last
// slot ends at param_count), so the slots tile the buffer. Taken from the last
// tensor to the first (the models register tensors in forward order, so this
// is the order their backward finishes them, up to tensors of one layer), they
// are grouped into buckets of contiguous slots of at most `bucket_bytes`; a
// tensor larger than that is a bucket of its own. Bucket 0 holds the last
// tensors. Each bucket is one StartAllReduceSum of its range.
//
// Numerics: a bucket's all-reduce sums the same elements the whole-buffer
// all-reduce would, and both communicators sum each element on its own (TCP:
// rank order, whatever the chunk or bucket it travels in), so bucketed and
// unbucketed reductions give the same bits on TCP; padding is zeros.
//
// Order across ranks: buckets start strictly in bucket order (bucket b only
// after b - 1 started), so every rank starts the same sequence of collectives
// even if its backward reports tensors in another order, or not at all.
#ifndef KEEL_WORKER_ENGINE_GRAD_BUCKETS_H_
#define KEEL_WORKER_ENGINE_GRAD_BUCKETS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/base/status.h"
#include "kernels/comm/comm.h"
#include "worker/engine/model.h"

namespace keel {

struct GradBucket {
  int64_t begin = 0, end = 0;          // floats [begin, end) of the flat gradient
  int first_param = 0, last_param = 0;  // the tensors whose slots tile it: indices first_param .. last_param
};

// The plan above. bucket_bytes > 0; params as Model::param_info() (offsets
// increasing), param_count the flat buffer's size in floats.
std::vector<GradBucket> PlanGradBuckets(const std::vector<ParamInfo>& params, int64_t param_count,
                                        double bucket_bytes);

// One rank's buckets over the steps. Per step: Begin, then the model's
// GradientReady calls Ready during the last micro-batch's backward, then
// Flush after it, then WaitAll before anything reads the gradient.
class GradBuckets {
 public:
  GradBuckets(const std::vector<ParamInfo>& params, int64_t param_count, double bucket_bytes);

  const std::vector<GradBucket>& plan() const { return plan_; }

  // A new backward: nothing reported, nothing started. The buckets reduce
  // grads (param_count floats, the backend's memory) over comm in `precision`.
  void Begin(Communicator* comm, float* grads, ReducePrecision precision);
  // Tensor `index`'s gradient is final (Model's GradientReady): starts, in
  // bucket order, every bucket whose tensors are all final and whose
  // predecessors have started. A tensor reported twice in one backward is an
  // error (the model's hooks are wrong: its gradient was not final).
  Status Ready(int index);
  // After the backward: starts every bucket not started yet, in order (their
  // tensors' gradients are final now, reported or not).
  Status Flush();
  // How many buckets started before Flush, i.e. while the backward ran.
  int started_early() const { return started_early_; }
  // Waits for every bucket started since Begin (all of them, even after a
  // failure; the first failure is returned) and adds the collectives' own
  // durations (Communicator::Wait's seconds) to *seconds.
  Status WaitAll(double* seconds);

 private:
  Status StartNext();

  std::vector<GradBucket> plan_;
  std::vector<int> bucket_of_;         // tensor -> its bucket
  std::vector<std::string> names_;     // tensor names, for errors
  // This backward's state.
  Communicator* comm_ = nullptr;
  float* grads_ = nullptr;
  ReducePrecision precision_ = ReducePrecision::kF32;
  std::vector<int> unreported_;        // per bucket: tensors not reported final yet
  std::vector<bool> reported_;         // per tensor
  std::vector<CommHandle> handles_;    // of the buckets started and not waited for, in order
  int started_ = 0;                    // buckets started (0 .. started_ - 1)
  int started_early_ = 0;
};

}  // namespace keel

#endif  // KEEL_WORKER_ENGINE_GRAD_BUCKETS_H_
