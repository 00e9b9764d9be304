// Few-row matmul `y[B, N] = x[B, K] @ w[N, K]^T` (fp32) for decoding on the CPU.
//
// At decode time a step multiplies a handful of rows by every weight matrix once, so
// it is bound by how fast the weights stream from memory. This kernel reads each
// weight row exactly once, as one contiguous stream, and spreads contiguous blocks of
// rows over as many threads as XLA's intra-op pool has (`cpu_parallel.h`).
// Built at first use by `cpu_ffi.py` with the machine's compiler (-O3 -march=native);
// the arithmetic is portable C++ (GCC/Clang vector extensions), not hand intrinsics.

#include <algorithm>
#include <cstdint>
#include <cstring>

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

// Below this many weight bytes a call runs on the calling thread alone (handing work
// to another thread costs more than it saves).
constexpr int64_t kMinParallelBytes = 256 * 1024;
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
  if (threads == 1 || bytes < kMinParallelBytes) {
    block(x.typed_data(), w.typed_data(), y->typed_data(), b, k, n, 0, n);
    return ffi::Error::Success();
  }
  const float* xp = x.typed_data();
  const float* wp = w.typed_data();
  float* yp = y->typed_data();
  int64_t blocks = std::min(n, threads * kBlocksPerThread);
  const int64_t rows_per_block = (n + blocks - 1) / blocks;
  blocks = (n + rows_per_block - 1) / rows_per_block;
  pipo::parallel_for(threads, blocks, [=](int64_t i) {
    const int64_t o0 = i * rows_per_block;
    block(xp, wp, yp, b, k, n, o0, std::min(n, o0 + rows_per_block));
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
