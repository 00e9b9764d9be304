// One-token decode attention over the KV cache (fp32) for decoding on the CPU.
//
// out[b, h] = softmax(q[b, h] . k[b, h/G, :, :n_b] / sqrt(Dh)) @ v[b, h/G, :n_b], with
// n_b = min(position_b + 1, S) slots per row (slots past the position are masked, so
// they are not read at all). The cache layout is `decode.DecodeCache`'s: keys
// [B, K, Dh, S] (scores are AXPYs along the contiguous slot axis), values [B, K, S, Dh]
// (the output is an AXPY along the contiguous head axis). Each (row, kv head) pair is
// one block of `cpu_parallel.h`'s parallel_for: its keys and values are read once from
// memory, the group's query heads going in pairs that share each load. XLA:CPU runs the
// same computation as G-row batched matmuls at ~12 GB/s; this streams the cache at
// ~0.75 of the machine's read bandwidth (`experiments/benchmarks/cpu_kernels.py`).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using pipo::load8;
using pipo::store8;
using pipo::v8f;

typedef int32_t v8i __attribute__((vector_size(32)));

// e^x, 8 lanes, relative error ~2e-7 (Cephes' expf polynomial on x - n ln2, times 2^n);
// 0 below -87.3 (where e^x leaves the normal floats).
inline v8f exp8(v8f x) {
  const v8f lo = v8f{} - 87.3f, hi = v8f{} + 88.7f;
  const v8i keep = x >= lo;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const v8f magic = v8f{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const v8f n = (x * 1.44269504088896341f + magic) - magic;
  const v8f r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  v8f p = v8f{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
  v8f scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  p *= scale;
  v8i out;
  std::memcpy(&out, &p, sizeof(out));
  out &= keep;
  std::memcpy(&p, &out, sizeof(p));
  return p;
}

// out[i, c] = factor[i] * sum_{t < terms} coef[i, t] * m[t * stride + c] for G = 1 or 2
// rows i (sharing each load of m) and c < cols, with coef rows coef_stride apart and out
// rows cols apart. The rows of m stream in order while 32 columns at a time accumulate
// in registers. Scores are this with m = keys [Dh, S] (terms Dh, columns the slots), the
// output with m = values [S, Dh] (terms the slots, columns Dh).
template <int G>
void combine_rows(const float* coef, int64_t coef_stride, const float* m, int64_t stride, int64_t terms,
                  int64_t cols, const float* factor, float* out) {
  int64_t c = 0;
  for (; c + 32 <= cols; c += 32) {
    v8f a[G][4] = {};
    for (int64_t t = 0; t < terms; ++t) {
      const float* row = m + t * stride + c;
      const v8f m0 = load8(row), m1 = load8(row + 8), m2 = load8(row + 16), m3 = load8(row + 24);
      for (int i = 0; i < G; ++i) {
        const float w = coef[i * coef_stride + t];
        a[i][0] += w * m0;
        a[i][1] += w * m1;
        a[i][2] += w * m2;
        a[i][3] += w * m3;
      }
    }
    for (int i = 0; i < G; ++i)
      for (int r = 0; r < 4; ++r) store8(out + i * cols + c + 8 * r, a[i][r] * factor[i]);
  }
  for (; c + 8 <= cols; c += 8) {
    v8f a[G] = {};
    for (int64_t t = 0; t < terms; ++t) {
      const v8f mt = load8(m + t * stride + c);
      for (int i = 0; i < G; ++i) a[i] += coef[i * coef_stride + t] * mt;
    }
    for (int i = 0; i < G; ++i) store8(out + i * cols + c, a[i] * factor[i]);
  }
  for (; c < cols; ++c) {
    for (int i = 0; i < G; ++i) {
      float a = 0.0f;
      for (int64_t t = 0; t < terms; ++t) a += coef[i * coef_stride + t] * m[t * stride + c];
      out[i * cols + c] = a * factor[i];
    }
  }
}

// s[:n] <- e^(s - max s); returns their sum.
float exp_shifted(float* s, int64_t n) {
  float m = s[0];
  int64_t j = 0;
  if (n >= 8) {
    v8f mv = load8(s);
    for (j = 8; j + 8 <= n; j += 8) {
      const v8f x = load8(s + j);
      mv = x > mv ? x : mv;
    }
    for (int r = 0; r < 8; ++r) m = std::max(m, mv[r]);
  }
  for (; j < n; ++j) m = std::max(m, s[j]);
  v8f total{};
  j = 0;
  for (; j + 8 <= n; j += 8) {
    const v8f e = exp8(load8(s + j) - m);
    store8(s + j, e);
    total += e;
  }
  float sum = pipo::hsum(total);
  for (; j < n; ++j) {
    v8f tail{};
    tail[0] = s[j] - m;
    s[j] = exp8(tail)[0];
    sum += s[j];
  }
  return sum;
}

// Attention of G = 1 or 2 query heads (q rows dh apart, out rows dh apart) over the n
// slots of one kv head: scores into p [G, n], softmax, weighted values.
template <int G>
void attend_heads(const float* q, const float* keys, const float* vals, int64_t dh, int64_t s, int64_t n,
                  float scale, float* p, float* out) {
  float scales[G], inv_total[G];
  for (int i = 0; i < G; ++i) scales[i] = scale;
  combine_rows<G>(q, dh, keys, s, dh, n, scales, p);
  for (int i = 0; i < G; ++i) inv_total[i] = 1.0f / exp_shifted(p + i * n, n);
  combine_rows<G>(p, n, vals, dh, n, dh, inv_total, out);
}

ffi::Error AttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                         ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S32> positions,
                         ffi::ResultBuffer<ffi::F32> out) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), pd = positions.dimensions();
  if (qd.size() != 3 || kd.size() != 4 || vd.size() != 4 || pd.size() != 1)
    return ffi::Error::InvalidArgument(
        "cpu_attention: expects q [B, H, Dh], k [B, K, Dh, S], v [B, K, S, Dh], positions [B]");
  const int64_t b = qd[0], h = qd[1], dh = qd[2], kv = kd[1], s = kd[3];
  if (kd[0] != b || kd[2] != dh || vd[0] != b || vd[1] != kv || vd[2] != s || vd[3] != dh || pd[0] != b)
    return ffi::Error::InvalidArgument("cpu_attention: q, k, v and positions disagree on B, K, S or Dh");
  if (kv == 0 || h % kv != 0)
    return ffi::Error::InvalidArgument("cpu_attention: query heads must be a multiple of kv heads");
  if (b == 0 || h == 0 || dh == 0) return ffi::Error::Success();
  if (s == 0) return ffi::Error::InvalidArgument("cpu_attention: the cache has no slots");

  const int64_t g = h / kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  const float* qp = q.typed_data();
  const float* kp = k.typed_data();
  const float* vp = v.typed_data();
  const int32_t* pos = positions.typed_data();
  float* op = out->typed_data();
  auto pair = [=](int64_t i) {  // row i / kv, kv head i % kv
    const int64_t row = i / kv;
    const int64_t n = std::clamp<int64_t>(static_cast<int64_t>(pos[row]) + 1, 1, s);
    const int64_t head0 = (i % kv) * g;
    thread_local std::vector<float> p;
    p.resize(2 * n);
    const float* keys = kp + i * dh * s;
    const float* vals = vp + i * s * dh;
    for (int64_t j = 0; j < g; j += 2) {  // query heads in pairs, sharing each key and value load
      const float* qj = qp + (row * h + head0 + j) * dh;
      float* oj = op + (row * h + head0 + j) * dh;
      if (j + 1 < g)
        attend_heads<2>(qj, keys, vals, dh, s, n, scale, p.data(), oj);
      else
        attend_heads<1>(qj, keys, vals, dh, s, n, scale, p.data(), oj);
    }
  };
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t bytes = 2 * b * kv * s * dh * static_cast<int64_t>(sizeof(float));
  pipo::parallel_for(threads, bytes, b * kv, pair);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PipoCpuDecodeAttentionF32, AttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q [B, H, Dh]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k [B, K, Dh, S]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v [B, K, S, Dh]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // positions [B]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [B, H, Dh]
);
