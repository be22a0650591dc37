#include "worker/experts/swiglu_batch.h"

#include <algorithm>

#include "common/kernels.h"
#include "common/matmul.h"

namespace charm {
namespace {

/// Output features per work item: enough weight bytes (64 rows of a 2048-wide bf16
/// matrix: 256 KiB) that handing out an item costs little next to computing it, few
/// enough that 8 decode experts make dozens of items for 2 threads to share.
constexpr int64_t kTileRows = 64;

/// Multiply-adds below which the whole batch runs on the calling thread (see
/// common/matmul.cpp's kParallelMinWork: waking the team costs tens of microseconds).
constexpr uint64_t kParallelMinWork = uint64_t{1} << 17;

int64_t tiles_of(int64_t features) { return (features + kTileRows - 1) / kTileRows; }

}  // namespace

void swiglu_batch(const std::vector<SwigluJob>& jobs, int64_t hidden, int64_t intermediate,
                  const ExpertActivation& activation) {
  // Scratch: gate then up outputs per job, [rows, intermediate] each; after phase 1 the
  // gate block holds silu(gate) * up, the input of down.
  std::vector<size_t> scratch_at(jobs.size() + 1, 0);
  uint64_t work = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    scratch_at[j + 1] = scratch_at[j] + 2 * jobs[j].rows * static_cast<size_t>(intermediate);
    work += 3 * jobs[j].rows * static_cast<uint64_t>(hidden) * static_cast<uint64_t>(intermediate);
    // An empty range computes nothing but checks the views and resolves CHARM_KERNELS,
    // so their errors are thrown here rather than inside the parallel region.
    for (const MatrixView* m : {&jobs[j].weights->gate, &jobs[j].weights->up, &jobs[j].weights->down}) {
      matmul_tile(*m, nullptr, 0, nullptr, nullptr, 0, 0);
    }
  }
  std::vector<float> scratch(scratch_at.back());
  const int64_t up_tiles = tiles_of(intermediate);
  const int64_t down_tiles = tiles_of(hidden);
  const auto njobs = static_cast<int64_t>(jobs.size());
#pragma omp parallel if (work >= kParallelMinWork)
  {
    // Phase 1, items (job, tile of intermediate features): gate, up, then the SwiGLU
    // product on that tile, elementwise, in place of gate.
#pragma omp for schedule(dynamic)
    for (int64_t item = 0; item < njobs * up_tiles; ++item) {
      const SwigluJob& job = jobs[static_cast<size_t>(item / up_tiles)];
      const int64_t o0 = (item % up_tiles) * kTileRows;
      const int64_t o1 = std::min(intermediate, o0 + kTileRows);
      float* gate = scratch.data() + scratch_at[static_cast<size_t>(item / up_tiles)];
      float* up = gate + job.rows * static_cast<size_t>(intermediate);
      matmul_tile(job.weights->gate, job.x, job.rows, job.weights->gate_bias, gate, o0, o1);
      matmul_tile(job.weights->up, job.x, job.rows, job.weights->up_bias, up, o0, o1);
      for (size_t r = 0; r < job.rows; ++r) {
        float* g = gate + r * static_cast<size_t>(intermediate);
        const float* u = up + r * static_cast<size_t>(intermediate);
        for (int64_t i = o0; i < o1; ++i) g[i] = activation(g[i], u[i]);
      }
    }
    // (the implicit barrier: down needs every intermediate feature of its rows)
    // Phase 2, items (job, tile of hidden features): down.
#pragma omp for schedule(dynamic)
    for (int64_t item = 0; item < njobs * down_tiles; ++item) {
      const SwigluJob& job = jobs[static_cast<size_t>(item / down_tiles)];
      const int64_t o0 = (item % down_tiles) * kTileRows;
      const float* act = scratch.data() + scratch_at[static_cast<size_t>(item / down_tiles)];
      matmul_tile(job.weights->down, act, job.rows, job.weights->down_bias, job.y, o0, std::min(hidden, o0 + kTileRows));
    }
  }
}

}  // namespace charm
