#include "worker/experts/swiglu_batch.h"

#include <algorithm>
#include <exception>

#include <omp.h>

#include "common/kernels.h"
#include "common/matmul.h"
#include "common/matmul_q8.h"
#include "common/reused_buffer.h"

namespace charm {
namespace {

/// Work items per thread that swiglu_batch aims for: enough that a thread held up (by
/// another process, or by a slower tier's rows) leaves the other little to wait for at
/// the barrier, few enough that each item streams a long run of weight rows.
constexpr int64_t kItemsPerThread = 4;

/// Tiles are whole multiples of this many output features (the q8 GEMM's panels take 8
/// rows at a time; 64 rows of a 2048-wide bf16 matrix are 256 KiB).
constexpr int64_t kTileAlign = 64;

/// Multiply-adds below which the whole batch runs on the calling thread (see
/// common/matmul.cpp's kParallelMinWork: waking the team costs tens of microseconds).
constexpr uint64_t kParallelMinWork = uint64_t{1} << 17;

/// Output features per work item for `features` features of each of `jobs` jobs on
/// `threads` threads: as few tiles per job as still give every thread kItemsPerThread
/// items, each tile a multiple of kTileAlign. Decode on 2 threads (8 experts of one row)
/// so takes each matrix whole, and a thread streams one matrix from end to end (its row
/// prefetch never lands in rows another thread takes next). Against the 64-row tiles
/// before, 8 random experts of 256 per call from RAM (alternating medians) took 8-10 %
/// less time as q8 Q2_K / Q3_K, 5-6 % as q8 Q4_K / Q6_K and 10 % as exact Q4_K / Q6_K.
/// Prefill's many experts take whole matrices too; one or two experts are still split.
int64_t tile_rows(int64_t features, size_t jobs, int threads) {
  const auto want = static_cast<int64_t>(std::max(threads, 1)) * kItemsPerThread;
  const int64_t n = std::max<int64_t>(1, static_cast<int64_t>(jobs));
  const int64_t per_job = (want + n - 1) / n;
  const int64_t rows = (features + per_job - 1) / per_job;
  return std::max(kTileAlign, (rows + kTileAlign - 1) / kTileAlign * kTileAlign);
}

/// Under `activations: q8` (common/matmul_q8.h), each job's input to one projection,
/// quantised once so that every tile of it shares the rows (per tile, matmul_tile would
/// compare the f32 rows with its cached ones); `use[j]` null where matmul_tile runs.
struct Q8Inputs {
  std::vector<Q8Activations> rows;
  std::vector<const Q8Activations*> use;  ///< empty when the mode is f32 (nothing to allocate then)
  explicit Q8Inputs(size_t jobs) {
    if (active_activation_mode() == ActivationMode::kQ8) {
      rows.resize(jobs);
      use.assign(jobs, nullptr);
    }
  }
  bool any() const { return !use.empty(); }

  /// Quantises job j's x for w when w takes the q8 kernels, or shares `same`'s rows when
  /// they quantised the same x for a weight of w's type (gate and up: the same bits).
  void prepare(size_t j, const MatrixView& w, const float* x, size_t n, const Q8Inputs* same = nullptr,
               const MatrixView* same_w = nullptr) {
    if (!any() || !uses_q8(w)) return;
    if (same && same->use[j] && same_w->shape.ggml_type == w.shape.ggml_type) {
      use[j] = same->use[j];
      return;
    }
    quantize_activations(active_kernel_path(), w, x, n, rows[j]);
    use[j] = &rows[j];
  }
};

/// matmul_tile, or the q8 kernels on job j's prepared rows.
void tile(const Q8Inputs& q8, size_t j, const MatrixView& w, const float* x, size_t rows, const float* bias, float* y,
          int64_t o0, int64_t o1) {
  if (q8.any() && q8.use[j]) {
    matmul_q8_tile(active_kernel_path(), w, *q8.use[j], bias, y, o0, o1);
  } else {
    matmul_tile(w, x, rows, bias, y, o0, o1);
  }
}

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
  // This thread's, kept between calls (common/reused_buffer.h). The region's threads use
  // the pointer: a thread_local named inside it would be each thread's own.
  thread_local ReusedBuffer<float> scratch_buffer;
  float* const scratch = scratch_buffer.get(scratch_at.back());
  Q8Inputs gate_q8(jobs.size()), up_q8(jobs.size()), down_q8(jobs.size());
  // A quantisation's error (it allocates) per job, rethrown after the region: an
  // exception must not leave an OpenMP region. A failed job's tiles take matmul_tile.
  std::vector<std::exception_ptr> failed(jobs.size());
  const int threads = omp_get_max_threads();
  const int64_t up_rows = tile_rows(intermediate, jobs.size(), threads);
  const int64_t down_rows = tile_rows(hidden, jobs.size(), threads);
  const int64_t up_tiles = (intermediate + up_rows - 1) / up_rows;
  const int64_t down_tiles = (hidden + down_rows - 1) / down_rows;
  const auto njobs = static_cast<int64_t>(jobs.size());
#pragma omp parallel if (work >= kParallelMinWork)
  {
    // Under q8, each job's x quantised once for gate and up (once for both when their
    // types match), jobs shared among the threads; then the barrier.
    if (gate_q8.any()) {
#pragma omp for schedule(dynamic)
      for (int64_t j = 0; j < njobs; ++j) {
        const auto jj = static_cast<size_t>(j);
        const ExpertView& ew = *jobs[jj].weights;
        try {
          gate_q8.prepare(jj, ew.gate, jobs[jj].x, jobs[jj].rows);
          up_q8.prepare(jj, ew.up, jobs[jj].x, jobs[jj].rows, &gate_q8, &ew.gate);
        } catch (...) {
          failed[jj] = std::current_exception();
        }
      }
    }
    // Phase 1, items (job, tile of intermediate features): gate, up, then the SwiGLU
    // product on that tile, elementwise, in place of gate.
#pragma omp for schedule(dynamic)
    for (int64_t item = 0; item < njobs * up_tiles; ++item) {
      const auto j = static_cast<size_t>(item / up_tiles);
      const SwigluJob& job = jobs[j];
      const int64_t o0 = (item % up_tiles) * up_rows;
      const int64_t o1 = std::min(intermediate, o0 + up_rows);
      float* gate = scratch + scratch_at[j];
      float* up = gate + job.rows * static_cast<size_t>(intermediate);
      tile(gate_q8, j, job.weights->gate, job.x, job.rows, job.weights->gate_bias, gate, o0, o1);
      tile(up_q8, j, job.weights->up, job.x, job.rows, job.weights->up_bias, up, o0, o1);
      for (size_t r = 0; r < job.rows; ++r) {
        float* g = gate + r * static_cast<size_t>(intermediate);
        const float* u = up + r * static_cast<size_t>(intermediate);
        for (int64_t i = o0; i < o1; ++i) g[i] = activation(g[i], u[i]);
      }
    }
    // (the implicit barrier: down needs every intermediate feature of its rows)
    // Under q8, each job's down input quantised once, then the barrier again (the same
    // branch on every thread: down_q8.any() is fixed before the region).
    if (down_q8.any()) {
#pragma omp for schedule(dynamic)
      for (int64_t j = 0; j < njobs; ++j) {
        const auto jj = static_cast<size_t>(j);
        try {
          down_q8.prepare(jj, jobs[jj].weights->down, scratch + scratch_at[jj], jobs[jj].rows);
        } catch (...) {
          if (!failed[jj]) failed[jj] = std::current_exception();
        }
      }
    }
    // Phase 2, items (job, tile of hidden features): down.
#pragma omp for schedule(dynamic)
    for (int64_t item = 0; item < njobs * down_tiles; ++item) {
      const auto j = static_cast<size_t>(item / down_tiles);
      const SwigluJob& job = jobs[j];
      const int64_t o0 = (item % down_tiles) * down_rows;
      const float* act = scratch + scratch_at[j];
      tile(down_q8, j, job.weights->down, act, job.rows, job.weights->down_bias, job.y, o0,
           std::min(hidden, o0 + down_rows));
    }
  }
  for (const std::exception_ptr& e : failed) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace charm
