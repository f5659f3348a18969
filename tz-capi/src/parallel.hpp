#pragma once
// Runs work items on a few threads. Items are claimed in order from an atomic
// counter; the first exception stops the rest and is rethrown to the caller
// together with the index of the item that raised it.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace tz::core {

inline unsigned default_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return std::clamp(hw == 0 ? 2u : hw, 2u, 64u);
}

struct ParallelFailure {
  std::exception_ptr error;
  size_t item = 0;
};

// Calls fn(i) for every i in [0, count). Returns normally, or rethrows the
// first failure after all threads stopped; `failed_item` receives its index.
template <class Fn>
void parallel_for(size_t count, unsigned threads, Fn&& fn, size_t* failed_item = nullptr) {
  if (count == 0) return;
  threads = unsigned(std::min<size_t>(std::max(threads, 1u), count));
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex failure_mutex;
  ParallelFailure failure;
  auto worker = [&] {
    for (;;) {
      if (stop.load(std::memory_order_relaxed)) return;
      const size_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= count) return;
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure.error || i < failure.item) {
          failure.error = std::current_exception();
          failure.item = i;
        }
        stop.store(true, std::memory_order_relaxed);
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  try {
    for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
  } catch (...) {
    // Could not start more threads: the ones we have (and this one) finish the work.
  }
  worker();
  for (auto& th : pool) th.join();
  if (failure.error) {
    if (failed_item) *failed_item = failure.item;
    std::rethrow_exception(failure.error);
  }
}

}  // namespace tz::core
