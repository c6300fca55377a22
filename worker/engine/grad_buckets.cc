// Gradient buckets (see grad_buckets.h).
#include "worker/engine/grad_buckets.h"

#include <algorithm>
#include <cmath>

namespace keel {

std::vector<GradBucket> PlanGradBuckets(const std::vector<ParamInfo>& params, int64_t param_count,
                                        double bucket_bytes) {
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(std::floor(bucket_bytes / sizeof(float))));
  std::vector<GradBucket> plan;
  GradBucket current;
  bool open = false;
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
    const int64_t begin = params[i].offset;
    const int64_t end = i + 1 < static_cast<int>(params.size()) ? params[i + 1].offset : param_count;
    if (open && current.end - begin > cap) {  // this slot would take the bucket past the cap
      plan.push_back(current);
      open = false;
    }
    if (!open) {
      current = GradBucket{begin, end, i, i};
      open = true;
    } else {
      current.begin = begin;
      current.first_param = i;
    }
  }
  if (open) plan.push_back(current);
  return plan;
}

GradBuckets::GradBuckets(const std::vector<ParamInfo>& params, int64_t param_count, double bucket_bytes)
    : plan_(PlanGradBuckets(params, param_count, bucket_bytes)), bucket_of_(params.size(), 0) {
  for (size_t b = 0; b < plan_.size(); ++b) {
    for (int i = plan_[b].first_param; i <= plan_[b].last_param; ++i) bucket_of_[i] = static_cast<int>(b);
  }
  for (const ParamInfo& p : params) names_.push_back(p.name);
}

void GradBuckets::Begin(Communicator* comm, float* grads, ReducePrecision precision) {
  comm_ = comm;
  grads_ = grads;
  precision_ = precision;
  unreported_.clear();
  for (const GradBucket& b : plan_) unreported_.push_back(b.last_param - b.first_param + 1);
  reported_.assign(bucket_of_.size(), false);
  handles_.clear();
  started_ = 0;
  started_early_ = 0;
}

Status GradBuckets::StartNext() {
  const GradBucket& b = plan_[started_];
  CommHandle handle = 0;
  KEEL_RETURN_IF_ERROR(comm_->StartAllReduceSum(grads_ + b.begin, b.end - b.begin, precision_, &handle));
  handles_.push_back(handle);
  ++started_;
  return Status::Ok();
}

Status GradBuckets::Ready(int index) {
  if (index < 0 || index >= static_cast<int>(reported_.size())) {
    return Status::Error("gradient buckets: tensor index " + std::to_string(index) + " is not a parameter (0 .. " +
                         std::to_string(static_cast<int>(reported_.size()) - 1) + ")");
  }
  if (reported_[index]) {
    return Status::Error("gradient buckets: the model reported " + names_[index] +
                         "'s gradient final twice in one backward (its bucket may have been reduced too early)");
  }
  reported_[index] = true;
  --unreported_[bucket_of_[index]];
  while (started_ < static_cast<int>(plan_.size()) && unreported_[started_] == 0) {
    KEEL_RETURN_IF_ERROR(StartNext());
    started_early_ = started_;
  }
  return Status::Ok();
}

Status GradBuckets::Flush() {
  while (started_ < static_cast<int>(plan_.size())) KEEL_RETURN_IF_ERROR(StartNext());
  return Status::Ok();
}

Status GradBuckets::WaitAll(double* seconds) {
  Status first = Status::Ok();
  for (CommHandle h : handles_) {
    double s = 0;
    const Status waited = comm_->Wait(h, &s);
    if (waited.ok()) *seconds += s;
    if (first.ok()) first = waited;
  }
  handles_.clear();
  return first;
}

}  // namespace keel
