// Counts the bytes LibTorch's CPU allocator holds for the threads it is installed on: now
// and at most since the last reset. A memory measurement (tests, benchmarks, the trainer's
// check of its estimate) installs it on the thread that runs the work; communicators that run
// collectives on threads of their own pass it on to them (c10's thread-local debug info, as
// at::launch does), so a rank's collectives count as the rank's. A counter installed inside
// another's scope counts for both (the trainer's inside a test's):
//
//   AllocationCounter counter;
//   {
//     AllocationCounter::Scope counting(counter);
//     Step();
//   }
//   int64_t peak = counter.peak();
#ifndef PLAIT_BASE_ALLOCATION_COUNTER_H_
#define PLAIT_BASE_ALLOCATION_COUNTER_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "base/torch_compat.h"
#include "c10/util/ThreadLocalDebugInfo.h"

namespace plait::base {

class AllocationCounter final : public CompatMemoryReporter {
 public:
  // Counts, while it lives, what the current thread allocates and frees (and the threads it
  // hands its debug info to). The counter must outlive it.
  class Scope {
   public:
    explicit Scope(AllocationCounter& counter)
        : outer_(dynamic_cast<AllocationCounter*>(
              c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE))),
          guard_(c10::DebugInfoKind::PROFILER_STATE,
                 std::shared_ptr<c10::DebugInfoBase>(&counter, [](c10::DebugInfoBase*) {})) {
      if (outer_ != &counter) counter.outer_ = outer_;
    }

   private:
    AllocationCounter* outer_;  // before guard_, which replaces it as the thread's
    c10::DebugInfoGuard guard_;
  };

  // Thread-safe: a communicator's thread reports beside the rank's.
  void OnMemoryUsage(int64_t bytes) override {
    if (outer_ != nullptr) outer_->OnMemoryUsage(bytes);
    const int64_t now = current_.fetch_add(bytes) + bytes;
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
  }

  // Counts from zero: what was allocated before is not counted (and its frees count below
  // zero).
  void Reset() {
    current_ = 0;
    peak_ = 0;
  }
  // The peak starts again from what is allocated now.
  void ResetPeak() { peak_ = current_.load(); }

  int64_t current() const { return current_.load(); }
  int64_t peak() const { return peak_.load(); }

 private:
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
  AllocationCounter* outer_ = nullptr;  // the counter whose scope its Scope was opened in
};

}  // namespace plait::base

#endif  // PLAIT_BASE_ALLOCATION_COUNTER_H_
