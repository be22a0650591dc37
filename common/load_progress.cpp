#include "common/load_progress.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace charm {
namespace {

// The binary unit that shows `bytes` with a leading digit: B, KiB, MiB, GiB, TiB.
std::pair<double, const char*> unit_of(uint64_t bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double scale = 1;
  int unit = 0;
  while (static_cast<double>(bytes) >= scale * 1024 && unit < 4) {
    scale *= 1024;
    ++unit;
  }
  return {scale, units[unit]};
}

// "1.2 of 4.0 GiB (30%)" and, once a rate is known, ", 350 MiB/s, 8 s left".
std::string progress_tail(uint64_t done, uint64_t total, double elapsed_s) {
  const auto [scale, unit] = unit_of(total);
  const double percent = total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0;
  std::string text = fmt::format("{:.1f} of {:.1f} {} ({:.0f}%)", static_cast<double>(done) / scale,
                                 static_cast<double>(total) / scale, unit, std::floor(percent));
  if (done == 0 || elapsed_s <= 0) return text;
  const double rate = static_cast<double>(done) / elapsed_s;  // bytes per second
  const auto [rate_scale, rate_unit] = unit_of(static_cast<uint64_t>(rate));
  const double left_s = static_cast<double>(total - done) / rate;
  return text + fmt::format(", {:.0f} {}/s, {:.0f} s left", rate / rate_scale, rate_unit, std::ceil(left_s));
}

double steady_now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

LoadProgressOptions default_load_progress_options() {
  LoadProgressOptions o;
  o.terminal = isatty(STDERR_FILENO) == 1;
  o.now_s = steady_now_s;
  o.bar = [](const std::string& text) {
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
  };
  o.line = [](const std::string& text) { spdlog::info("{}", text); };
  return o;
}

std::string format_load_progress(const std::string& label, uint64_t done_bytes, uint64_t total_bytes,
                                 double elapsed_s) {
  return label + ": " + progress_tail(std::min(done_bytes, total_bytes), total_bytes, elapsed_s);
}

std::string format_load_bar(const std::string& label, uint64_t done_bytes, uint64_t total_bytes, double elapsed_s,
                            int width) {
  const uint64_t done = std::min(done_bytes, total_bytes);
  const int filled =
      total_bytes ? static_cast<int>(static_cast<double>(width) * static_cast<double>(done) / static_cast<double>(total_bytes))
                  : width;
  // The trailing spaces blank what a longer previous redraw left on the line.
  return "\r" + label + " [" + std::string(static_cast<size_t>(filled), '#') +
         std::string(static_cast<size_t>(width - filled), '.') + "] " + progress_tail(done, total_bytes, elapsed_s) +
         "    ";
}

LoadProgress::LoadProgress(std::string label, uint64_t total_bytes, LoadProgressOptions options)
    : label_(std::move(label)), total_(total_bytes), options_(std::move(options)) {
  if (!options_.now_s) options_.now_s = steady_now_s;
  start_s_ = options_.now_s();
}

LoadProgress::~LoadProgress() { finish(); }

void LoadProgress::add(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  done_ = std::min(total_, done_ + bytes);
  if (finished_ || total_ == 0) return;
  const double now = options_.now_s();
  if (now - start_s_ < options_.quiet_s) return;
  const double every = options_.terminal ? options_.bar_every_s : options_.log_every_s;
  // The first line comes as soon as the quiet time is over; then one per `every`.
  if (last_shown_s_ >= 0 && now - last_shown_s_ < every) return;
  show_locked(now);
}

void LoadProgress::show_locked(double now) {
  last_shown_s_ = now;
  const double elapsed = now - start_s_;
  if (options_.terminal) {
    if (options_.bar) options_.bar(format_load_bar(label_, done_, total_, elapsed));
  } else if (options_.line) {
    options_.line(format_load_progress(label_, done_, total_, elapsed));
  }
}

void LoadProgress::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (finished_) return;
  finished_ = true;
  if (last_shown_s_ < 0) return;  // a quick load stays silent
  const double elapsed = options_.now_s() - start_s_;
  const auto [scale, unit] = unit_of(done_);
  const double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0;
  const auto [rate_scale, rate_unit] = unit_of(static_cast<uint64_t>(rate));
  const std::string summary = fmt::format("{}: {:.1f} {} in {:.1f} s ({:.0f} {}/s){}", label_,
                                          static_cast<double>(done_) / scale, unit, elapsed, rate / rate_scale,
                                          rate_unit, done_ < total_ ? ", stopped before the end" : "");
  if (options_.terminal) {
    if (options_.bar) options_.bar(format_load_bar(label_, done_, total_, elapsed) + "\n");
  }
  if (options_.line) options_.line(summary);
}

uint64_t LoadProgress::done_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

}  // namespace charm
