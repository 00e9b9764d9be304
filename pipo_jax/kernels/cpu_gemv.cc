// Decode-step matmul `y[B, N] = x[B, K] @ w[N, K]^T` (fp32) on the CPU.
//
// Up to kDotMaxRows rows (decoding batch 1-8) a step is bound by how fast the weights
// stream from memory: each weight row is read exactly once, as one contiguous stream,
// and dotted with every x row while it is in L1. With more rows the step is bound by
// the FMA units instead, and the product runs as a small GEMM: panels of 16
// weight rows are transposed into a k-major buffer (in L1/L2) and a 6 x 16 register
// tile (12 accumulators, 2 loads + 6 broadcasts per 12 FMAs) sweeps the x rows over
// each panel, with no horizontal sums. Either way contiguous blocks of weight rows are
// spread over as many threads as XLA's intra-op pool has (`cpu_parallel.h`).
// Built at first use by `cpu_ffi.py` with the machine's compiler (-O3 -march=native);
// the arithmetic is portable C++ (GCC/Clang vector extensions) except the 8 x 8
// transpose of the packing, which has an AVX version beside its portable one.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "cpu_parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using pipo::hsum;
using pipo::load8;
using pipo::v8f;

// y[r, o] = dot(w[o, :], x[r, :]) for R rows of x (row stride k, output stride n) and
// weight rows o in [o0, o1). Two accumulators per x row keep the FMA chains short.
template <int R>
void dot_rows(const float* x, const float* w, float* y, int64_t k, int64_t n, int64_t o0, int64_t o1) {
  const int64_t k16 = k - k % 16;
  for (int64_t o = o0; o < o1; ++o) {
    const float* wr = w + o * k;
    v8f a[R], b[R];
    for (int r = 0; r < R; ++r) a[r] = b[r] = v8f{};
    for (int64_t i = 0; i < k16; i += 16) {
      const v8f w0 = load8(wr + i), w1 = load8(wr + i + 8);
      for (int r = 0; r < R; ++r) {
        a[r] += w0 * load8(x + r * k + i);
        b[r] += w1 * load8(x + r * k + i + 8);
      }
    }
    for (int r = 0; r < R; ++r) {
      float s = hsum(a[r] + b[r]);
      for (int64_t i = k16; i < k; ++i) s += wr[i] * x[r * k + i];
      y[r * n + o] = s;
    }
  }
}

// All B rows of x against weight rows [o0, o1), in groups of at most four x rows
// (a weight row is re-read from L1 for each group).
void block(const float* x, const float* w, float* y, int64_t b, int64_t k, int64_t n, int64_t o0, int64_t o1) {
  int64_t r = 0;
  for (; r + 4 <= b; r += 4) dot_rows<4>(x + r * k, w, y + r * n, k, n, o0, o1);
  switch (b - r) {
    case 3: dot_rows<3>(x + r * k, w, y + r * n, k, n, o0, o1); break;
    case 2: dot_rows<2>(x + r * k, w, y + r * n, k, n, o0, o1); break;
    case 1: dot_rows<1>(x + r * k, w, y + r * n, k, n, o0, o1); break;
    default: break;
  }
}

// ---------------------------------------------------------------------------------
// More rows: packed panels and a register tile.

constexpr int64_t kDotMaxRows = 8;  // above this many x rows, the GEMM path
constexpr int64_t kPanel = 16;      // weight rows per packed panel (two vectors)
constexpr int kTileRows = 6;        // x rows per register tile

// dst[i * 16 + j] = src[j * k + i] for 8 weight rows j and 8 positions i (an 8 x 8
// transpose into a panel whose rows are 16 floats).
inline void transpose8(const float* src, int64_t k, float* dst) {
#if defined(__AVX__)
  __m256 r[8], t[8], u[8];
  for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(src + j * k);
  for (int j = 0; j < 8; j += 2) {
    t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
    t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
  }
  for (int j = 0; j < 8; j += 4) {
    u[j] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44);
    u[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xEE);
    u[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44);
    u[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * kPanel, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * kPanel, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
  }
#else
  for (int j = 0; j < 8; ++j)
    for (int i = 0; i < 8; ++i) dst[i * kPanel + j] = src[j * k + i];
#endif
}

// panel[i * 16 + j] = w[o + j, i] for j < cols (<= 16), 0 for cols <= j < 16.
void pack_panel(const float* w, int64_t k, int64_t o, int64_t cols, float* panel) {
  const float* src = w + o * k;
  int64_t j = 0;
  if (cols == kPanel) {
    const int64_t k8 = k - k % 8;
    for (int64_t i = 0; i < k8; i += 8) {
      transpose8(src + i, k, panel + i * kPanel);
      transpose8(src + 8 * k + i, k, panel + i * kPanel + 8);
    }
    for (int64_t i = k8; i < k; ++i)
      for (int64_t c = 0; c < kPanel; ++c) panel[i * kPanel + c] = src[c * k + i];
    return;
  }
  for (; j < cols; ++j)
    for (int64_t i = 0; i < k; ++i) panel[i * kPanel + j] = src[j * k + i];
  for (; j < kPanel; ++j)
    for (int64_t i = 0; i < k; ++i) panel[i * kPanel + j] = 0.0f;
}

// y[r, o + j] = sum_i x[r, i] * panel[i * 16 + j] for R rows of x and j < cols.
// `ahead` (or null): 16 * k floats (k cache lines) to prefetch, one line per step, so
// the next panel's weights arrive from memory while this one computes (the hardware
// prefetchers follow streams that are being read, and the tiles read none).
template <int R>
void panel_tile(const float* x, const float* panel, float* y, int64_t k, int64_t n, int64_t o, int64_t cols,
                const float* ahead) {
  v8f lo[R], hi[R];
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = v8f{};
  for (int64_t i = 0; i < k; ++i) {
    if (ahead != nullptr) __builtin_prefetch(ahead + i * kPanel, 0, 2);
    const v8f p0 = load8(panel + i * kPanel), p1 = load8(panel + i * kPanel + 8);
    for (int r = 0; r < R; ++r) {
      const float xr = x[r * k + i];  // splat by the scalar-vector product
      lo[r] += xr * p0;
      hi[r] += xr * p1;
    }
  }
  for (int r = 0; r < R; ++r) {
    float* yr = y + r * n + o;
    if (cols == kPanel) {
      pipo::store8(yr, lo[r]);
      pipo::store8(yr + 8, hi[r]);
    } else {
      for (int64_t j = 0; j < cols; ++j) yr[j] = j < 8 ? lo[r][j] : hi[r][j - 8];
    }
  }
}

// All B rows of x against weight rows [o0, o1), one packed panel at a time.
void gemm_block(const float* x, const float* w, float* y, int64_t b, int64_t k, int64_t n, int64_t o0,
                int64_t o1) {
  thread_local std::vector<float> panel;
  panel.resize(k * kPanel);
  for (int64_t o = o0; o < o1; o += kPanel) {
    const int64_t cols = std::min(kPanel, o1 - o);
    pack_panel(w, k, o, cols, panel.data());
    // ceil(B / 6) tiles of as equal heights as can be (32 rows: 6, 6, 5, 5, 5, 5): a
    // short tile has too few accumulators to hide the FMA latency.
    const int64_t tiles = (b + kTileRows - 1) / kTileRows;
    for (int64_t t = 0, r = 0; t < tiles; ++t) {
      const int64_t height = b / tiles + (t < b % tiles ? 1 : 0);
      const float* xr = x + r * k;
      float* yr = y + r * n;
      r += height;
      const float* ahead = t == 0 && o + 2 * kPanel <= o1 ? w + (o + kPanel) * k : nullptr;
      switch (height) {
        case 6: panel_tile<6>(xr, panel.data(), yr, k, n, o, cols, ahead); break;
        case 5: panel_tile<5>(xr, panel.data(), yr, k, n, o, cols, ahead); break;
        case 4: panel_tile<4>(xr, panel.data(), yr, k, n, o, cols, ahead); break;
        case 3: panel_tile<3>(xr, panel.data(), yr, k, n, o, cols, ahead); break;
        case 2: panel_tile<2>(xr, panel.data(), yr, k, n, o, cols, ahead); break;
        case 1: panel_tile<1>(xr, panel.data(), yr, k, n, o, cols, ahead); break;
        default: break;
      }
    }
  }
}

// Each thread's share is split in this many blocks so a slow thread can be helped.
constexpr int64_t kBlocksPerThread = 4;

ffi::Error GemvImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                    ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (wd.size() != 2 || xd.size() < 1 || yd.size() != xd.size())
    return ffi::Error::InvalidArgument("cpu_gemv: expects x [..., K], w [N, K], y [..., N]");
  const int64_t n = wd[0], k = wd[1];
  if (xd.back() != k || yd.back() != n)
    return ffi::Error::InvalidArgument("cpu_gemv: x's last axis must equal w's and y's must equal w's first");
  int64_t b = 1;
  for (size_t i = 0; i + 1 < xd.size(); ++i) {
    if (xd[i] != yd[i]) return ffi::Error::InvalidArgument("cpu_gemv: x and y leading axes differ");
    b *= xd[i];
  }
  if (b == 0 || n == 0) return ffi::Error::Success();
  if (k == 0) {
    std::memset(y->typed_data(), 0, sizeof(float) * b * n);
    return ffi::Error::Success();
  }

  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t bytes = n * k * static_cast<int64_t>(sizeof(float));
  const bool gemm = b > kDotMaxRows;
  const float* xp = x.typed_data();
  const float* wp = w.typed_data();
  float* yp = y->typed_data();
  const auto rows = [=](int64_t o0, int64_t o1) {
    if (gemm)
      gemm_block(xp, wp, yp, b, k, n, o0, o1);
    else
      block(xp, wp, yp, b, k, n, o0, o1);
  };
  // Contiguous blocks of weight rows (whole panels on the GEMM path).
  const int64_t unit = gemm ? kPanel : 1;
  const int64_t units = (n + unit - 1) / unit;
  int64_t blocks = std::min(units, threads * kBlocksPerThread);
  const int64_t rows_per_block = (units + blocks - 1) / blocks * unit;
  blocks = (n + rows_per_block - 1) / rows_per_block;
  pipo::parallel_for(threads, bytes, blocks, [=](int64_t i) {
    const int64_t o0 = i * rows_per_block;
    rows(o0, std::min(n, o0 + rows_per_block));
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PipoCpuGemvF32, GemvImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [..., K]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w [N, K]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [..., N]
);
