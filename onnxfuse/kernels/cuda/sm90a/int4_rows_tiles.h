// The row tiles of the int4 rows path's sm_90a form (cuda/sm90a/int4_rows_wgmma.cu), one table for the two sides
// that need them: the kernel's launch (a tile's ring steps and its __launch_bounds__ blocks) and RowsPlanFor's plan
// (cuda/int4_linear.cu: which tile takes m rows, and the blocks an SM its K split counts on). Host and device code,
// no CUDA headers.
#pragma once
#include <cstdint>

namespace onnxfuse::cuda_kernels::int4_rows {

// rows: the tile's rows (the wgmma's N); stages: the cp.async ring; minb: __launch_bounds__'s blocks an SM (the
// registers a thread may take); per_sm: the blocks an SM hold in fact. Measured on an H200, the Llama-2-7B layer
// (benchmarks/results/h200-2026-12-01/int4/gemm-rows-probe-wgmma-rows.txt, -tiles160.txt): 96 rows on 4 stages (90
// registers, two blocks an SM as they are; held to 85 for three, it spilled and lost); 128 and 160 rows on 3 stages
// held to 128 registers, two blocks an SM (188.7 us at 128 rows against 210.1 on one block an SM with 4 stages; 222.8 /
// 231.0 at 144 / 160 rows against the 192-row tile's 258.9 / 258.8); 192 rows on 4 stages, one block an SM (157
// registers).
struct WgmmaTile {
  int rows, stages, minb, per_sm;
};
inline constexpr WgmmaTile kWgmmaTiles[] = {{96, 4, 1, 2}, {128, 3, 2, 2}, {160, 3, 2, 2}, {192, 4, 1, 1}};
inline constexpr int kWgmmaTileCount = int(sizeof(kWgmmaTiles) / sizeof(kWgmmaTiles[0]));

constexpr bool WgmmaTilesOrdered() {
  for (int i = 0; i < kWgmmaTileCount; ++i) {
    const WgmmaTile& t = kWgmmaTiles[i];
    if (t.rows % 8 != 0 || t.stages < 2 || t.minb < 1 || t.per_sm < t.minb) return false;
    if (i > 0 && kWgmmaTiles[i - 1].rows >= t.rows) return false;
  }
  return true;
}
static_assert(WgmmaTilesOrdered(),
              "tiles by rising rows (multiples of 8, a wgmma N), a ring of 2 or more, per_sm >= minb");

// The index of the smallest tile that holds m rows (the largest past them: the caller keeps m within it).
constexpr int WgmmaTileFor(int64_t m) {
  int i = 0;
  while (i + 1 < kWgmmaTileCount && kWgmmaTiles[i].rows < m) ++i;
  return i;
}

}  // namespace onnxfuse::cuda_kernels::int4_rows
