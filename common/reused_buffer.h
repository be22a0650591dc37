// ReusedBuffer: a thread's scratch kept from call to call, for buffers that scale with a
// batch (a prefill's gathered expert rows).
//
// Why: glibc serves an allocation above its mmap threshold (32 MiB at most) with a fresh
// mapping and unmaps it on free, and smaller ones often from heap pages it trimmed back;
// either way every page is faulted in and zeroed by the kernel again on each call. A
// 512-token prefill of the OLMoE-shaped benchmark allocated about 83,000 such pages per
// prompt (perf stat, minor-faults, against a one-token prompt), most of them in the
// worker's per-layer buffers (docs/benchmarks.md).
#pragma once

#include <cstddef>
#include <memory>

namespace charm {

/// Storage for n values of T, kept between calls (one object per thread: `thread_local`).
/// Not thread-safe. Storage above kKeptBytes is given back at the next smaller request, so
/// one rare large batch does not hold its peak for the life of the thread.
template <class T>
class ReusedBuffer {
 public:
  static constexpr size_t kKeptBytes = size_t{256} << 20;

  /// At least n values' storage; its contents are whatever the last caller left (nothing
  /// is zeroed). Earlier pointers are invalid after a call that reallocates (n above the
  /// capacity, or a capacity above kKeptBytes and n below it). Throws std::bad_alloc.
  T* get(size_t n) {
    const bool oversized = capacity_ * sizeof(T) > kKeptBytes && n * sizeof(T) <= kKeptBytes;
    if (n > capacity_ || oversized) {
      data_.reset();  // before the new allocation: the old and new need not both fit
      capacity_ = 0;
      data_ = std::make_unique_for_overwrite<T[]>(n);
      capacity_ = n;
    }
    return data_.get();
  }

  size_t capacity() const { return capacity_; }

 private:
  std::unique_ptr<T[]> data_;
  size_t capacity_ = 0;
};

}  // namespace charm
