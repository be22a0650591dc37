// Progress of a long load (a known number of bytes): a bar redrawn in place on a terminal,
// log lines otherwise, and nothing at all for a load that ends within a couple of seconds.
// Used by the coordinator's dense-weight load (Checkpoint::load_matrix) and a worker's
// pinned-expert reads (ExpertCache).
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

namespace charm {

/// How a LoadProgress shows itself. The clock and the output are injected so tests run
/// without time or a terminal.
struct LoadProgressOptions {
  double quiet_s = 2.0;         ///< show nothing until the load has taken this long (s)
  double bar_every_s = 0.2;     ///< redraw the bar at most this often (s)
  double log_every_s = 5.0;     ///< one log line at most this often (s)
  bool terminal = false;        ///< draw a bar (stderr is a TTY) rather than log lines
  std::function<double()> now_s;                   ///< monotonic seconds; default steady_clock
  std::function<void(const std::string&)> bar;     ///< writes a bar (no newline); default stderr
  std::function<void(const std::string&)> line;    ///< writes a log line; default spdlog info
};

/// The defaults for this process: terminal = isatty(stderr), steady_clock, stderr, spdlog.
LoadProgressOptions default_load_progress_options();

/// One line of progress, e.g.
///   "worker w0: pinned experts 1.2 of 4.0 GiB (30%), 350 MiB/s, 8 s left"
/// `done_bytes` <= `total_bytes`; `elapsed_s` > 0 gives the rate and time left (omitted
/// while nothing has been loaded). Sizes in binary units (KiB, MiB, GiB).
std::string format_load_progress(const std::string& label, uint64_t done_bytes, uint64_t total_bytes,
                                 double elapsed_s);

/// The terminal form: "\r<label> [#####.....] <as format_load_progress after the label>",
/// a bar of `width` cells.
std::string format_load_bar(const std::string& label, uint64_t done_bytes, uint64_t total_bytes, double elapsed_s,
                            int width = 30);

/// Counts bytes towards a total and shows progress as LoadProgressOptions says. finish()
/// (or the destructor) ends it: a final line "<label>: <total> in <s> s (<rate>)" when
/// anything was shown, so a bar is never left unterminated. Thread-safe: add() may be
/// called from any thread (I/O pool threads do).
class LoadProgress {
 public:
  /// `label` names what loads ("charm serve: dense weights"); `total_bytes` may be 0
  /// (then nothing is ever shown).
  LoadProgress(std::string label, uint64_t total_bytes, LoadProgressOptions options = default_load_progress_options());
  ~LoadProgress();
  LoadProgress(const LoadProgress&) = delete;
  LoadProgress& operator=(const LoadProgress&) = delete;

  /// `bytes` more are loaded (the count is capped at the total).
  void add(uint64_t bytes);
  /// Ends the display; later add() calls only count.
  void finish();
  /// Bytes counted so far.
  uint64_t done_bytes() const;

 private:
  void show_locked(double now);

  const std::string label_;
  const uint64_t total_;
  LoadProgressOptions options_;
  mutable std::mutex mutex_;
  uint64_t done_ = 0;
  double start_s_ = 0;
  double last_shown_s_ = -1;  // when a bar or line was last written; -1 never
  bool finished_ = false;
};

}  // namespace charm
