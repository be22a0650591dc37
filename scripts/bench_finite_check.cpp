// What the NaN/Inf check on every expert read costs next to the read itself (issue 12,
// item 7; docs/architecture.md, "Bad checkpoints"). Writes one expert-sized file of
// finite bf16 values, then times, best of --repeat:
//   pread hot    the file from the page cache (the cheapest read a worker can do)
//   pread cold   the same after posix_fadvise(DONTNEED) (a real disk read)
//   scan bf16    first_non_finite over the buffer just read (what Checkpoint::read_slice adds)
//   scan fp8     the same scan for F8_E4M3 bytes
// Build and run (after cmake --build build --target charm_common):
//   g++ -O3 -std=c++20 -I. scripts/bench_finite_check.cpp build/libcharm_common.a -o /tmp/bench_finite_check
//   /tmp/bench_finite_check [MiB per expert, default 9 (Qwen3-30B-A3B: 3 x 768 x 2048 bf16)] [repeat]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void pread_all(int fd, uint8_t* dst, size_t bytes) {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd, dst + done, bytes - done, static_cast<off_t>(done));
    if (n <= 0) {
      std::perror("pread");
      std::exit(1);
    }
    done += static_cast<size_t>(n);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const double mib = argc > 1 ? std::atof(argv[1]) : 9.0;
  const int repeat = argc > 2 ? std::atoi(argv[2]) : 20;
  const size_t bytes = static_cast<size_t>(mib * 1024 * 1024) / 2 * 2;
  std::vector<uint8_t> data(bytes);
  for (size_t i = 0; i < bytes; i += 2) {  // finite bf16 values near 1, as trained weights
    const uint16_t v = charm::f32_to_bf16(0.01f * static_cast<float>(i % 977) - 4.0f);
    data[i] = static_cast<uint8_t>(v & 0xff);
    data[i + 1] = static_cast<uint8_t>(v >> 8);
  }
  const std::string path = "/tmp/charm-bench-finite-" + std::to_string(::getpid()) + ".bin";
  const int out = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (out < 0 || ::write(out, data.data(), bytes) != static_cast<ssize_t>(bytes) || ::fsync(out) != 0) {
    std::perror(path.c_str());
    return 1;
  }
  ::close(out);
  const int fd = ::open(path.c_str(), O_RDONLY);
  std::vector<uint8_t> buffer(bytes);
  std::vector<uint8_t> fp8(bytes);  // finite e4m3 codes (0x7f / 0xff are its NaNs)
  for (size_t i = 0; i < bytes; ++i) fp8[i] = static_cast<uint8_t>(i % 0x7f) | (i % 2 ? 0x80 : 0);
  double hot = 1e9, cold = 1e9, scan16 = 1e9, scan8 = 1e9;
  uint64_t sink = 0;
  for (int r = 0; r < repeat; ++r) {
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    auto t = std::chrono::steady_clock::now();
    pread_all(fd, buffer.data(), bytes);
    cold = std::min(cold, seconds_since(t));
    t = std::chrono::steady_clock::now();
    pread_all(fd, buffer.data(), bytes);
    hot = std::min(hot, seconds_since(t));
    t = std::chrono::steady_clock::now();
    sink += charm::first_non_finite(charm::DType::kBF16, buffer.data(), bytes / 2);
    scan16 = std::min(scan16, seconds_since(t));
    t = std::chrono::steady_clock::now();
    sink += charm::first_non_finite(charm::DType::kF8E4M3, fp8.data(), bytes);
    scan8 = std::min(scan8, seconds_since(t));
  }
  ::close(fd);
  ::unlink(path.c_str());
  const double gb = static_cast<double>(bytes) / 1e9;
  if (sink != static_cast<uint64_t>(repeat) * (bytes / 2 + bytes)) {
    std::fprintf(stderr, "a scan found a non-finite value in finite data\n");
    return 1;
  }
  std::printf("expert of %.1f MiB, best of %d\n", mib, repeat);
  std::printf("%-12s %10s %10s %14s\n", "step", "ms", "GB/s", "vs pread hot");
  for (auto [name, s] : {std::pair{"pread cold", cold}, {"pread hot", hot}, {"scan bf16", scan16}, {"scan fp8", scan8}}) {
    std::printf("%-12s %10.3f %10.2f %13.1f%%\n", name, s * 1e3, gb / s, 100.0 * s / hot);
  }
  return 0;
}
