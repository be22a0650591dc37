// A bounded pool of I/O threads: expert reads run here so that the request thread can
// compute resident experts meanwhile. At most `threads` reads are in flight at once;
// further jobs wait in a FIFO queue.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace charm {

class IoPool {
 public:
  /// Starts `threads` (>= 1) threads.
  explicit IoPool(int threads);
  /// Runs every queued job, then joins the threads.
  ~IoPool();
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  /// Queues `job`; it runs on a pool thread. Jobs must not throw (catch inside).
  void submit(std::function<void()> job);

 private:
  void loop();
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace charm
