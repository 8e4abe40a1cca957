// EnResNet's noise injection y = x + c * std(x) * z, z ~ N(0, 1), fused, as
// XLA FFI handlers for CPU.
//
// The injection runs after every residual block of every member in every
// forward pass (about 250 M normals per PGD-10 step of En2ResNet20 at batch
// 128). As XLA fusions it cost a quarter of that step: the draw, the
// standard deviation, the add and their gradients each streamed the
// activations through memory. Here the forward pass reads x twice
// (statistics, then y, drawing z on the way) and the backward pass reads
// the cotangent twice (<dy, z>, then dx).
//
// z is fkjax.models.noise.standard_normal's draw: Threefry-2x32 of the
// counters (example, j) under the key, the pair's first word for position j
// of the example and its second for position j + ceil(cols / 2), each mapped
// to a normal by sqrt(2) erfinv(2u - 1) with XLA's erfinv polynomial. The
// values equal the jnp ones to float32 rounding
// (tests/test_kernels_noise.py).
//
//   fkjax_noise_inject_fwd  (x, key) -> (y, z, stats)  z is kept for the
//                           backward pass (one write is cheaper than drawing
//                           it again) unless its result is given size 0
//   fkjax_noise_inject_bwd  (dy, x, z, stats) -> dx
// x is [rows, cols] (batch first, the rest flattened); stats holds
// (mean, std) per group: one group, or one per example when per_example.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// One build runs on any x86-64; the loops below vectorise to each level.
#define FKJAX_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FKJAX_VECTOR_CLONES
#endif

constexpr int kBlock = 64;  // pairs per vectorised block

inline uint32_t Rotl(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

inline float AsFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint32_t AsBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

// Natural log of t in (0, 1] (normal floats), Cephes' logf polynomial:
// relative error ~1 ulp, and accurate for t near 1, where the erfinv
// argument is near 0.
inline float Log(float t) {
  uint32_t bits = AsBits(t);
  float e = static_cast<float>(static_cast<int>((bits >> 23) & 0xff) - 126);
  float m = AsFloat((bits & 0x007fffffu) | 0x3f000000u);  // [0.5, 1)
  bool small = m < 0.707106781186547524f;
  e = small ? e - 1.0f : e;
  float f = small ? m + m - 1.0f : m - 1.0f;
  float z = f * f;
  float y = 7.0376836292e-2f;
  y = y * f - 1.1514610310e-1f;
  y = y * f + 1.1676998740e-1f;
  y = y * f - 1.2420140846e-1f;
  y = y * f + 1.4249322787e-1f;
  y = y * f - 1.6668057665e-1f;
  y = y * f + 2.0000714765e-1f;
  y = y * f - 2.4999993993e-1f;
  y = y * f + 3.3333331174e-1f;
  y = y * f * z;
  y += -2.12194440e-4f * e;
  y += -0.5f * z;
  return f + y + 0.693359375f * e;
}

// A standard normal from 32 random bits, as jax.random.normal maps them:
// 23 bits to u in [0, 1), then sqrt(2) erfinv(max(2u - 1, -1 + ulp)) with
// XLA's single-precision erfinv (Giles 2010).
inline float Normal(uint32_t bits) {
  float u = AsFloat((bits >> 9) | 0x3f800000u) - 1.0f;
  float x = 2.0f * u - 1.0f;
  x = x < -0.99999994f ? -0.99999994f : x;
  float w = -Log((1.0f - x) * (1.0f + x));
  bool lt = w < 5.0f;
  // Both branches computed, then selected: the vectoriser wants no jumps.
  float root = std::sqrt(w);
  float v = lt ? w - 2.5f : root - 3.0f;
  float p = lt ? 2.81022636e-08f : -0.000200214257f;
  p = (lt ? 3.43273939e-07f : 0.000100950558f) + p * v;
  p = (lt ? -3.5233877e-06f : 0.00134934322f) + p * v;
  p = (lt ? -4.39150654e-06f : -0.00367342844f) + p * v;
  p = (lt ? 0.00021858087f : 0.00573950773f) + p * v;
  p = (lt ? -0.00125372503f : -0.0076224613f) + p * v;
  p = (lt ? -0.00417768164f : 0.00943887047f) + p * v;
  p = (lt ? 0.246640727f : 1.00167406f) + p * v;
  p = (lt ? 1.50140941f : 2.83297682f) + p * v;
  return 1.41421356237309505f * p * x;
}

inline void Mix(uint32_t& x0, uint32_t& x1, int r) {
  x0 += x1;
  x1 = x0 ^ Rotl(x1, r);
}

// Four rounds with rotations (a, b, c, d), then the key injection number i.
inline void Rounds(uint32_t& x0, uint32_t& x1, int a, int b, int c, int d,
                   uint32_t key0, uint32_t key1, uint32_t i) {
  Mix(x0, x1, a);
  Mix(x0, x1, b);
  Mix(x0, x1, c);
  Mix(x0, x1, d);
  x0 += key0;
  x1 += key1 + i;
}

// Threefry-2x32, 20 rounds (Salmon et al. 2011), as jax computes it; written
// out, because the vectoriser wants straight-line code.
inline void Threefry(uint32_t k0, uint32_t k1, uint32_t c0, uint32_t c1,
                     uint32_t* out0, uint32_t* out1) {
  const uint32_t k2 = k0 ^ k1 ^ 0x1BD11BDAu;
  uint32_t x0 = c0 + k0, x1 = c1 + k1;
  Rounds(x0, x1, 13, 15, 26, 6, k1, k2, 1);
  Rounds(x0, x1, 17, 29, 16, 24, k2, k0, 2);
  Rounds(x0, x1, 13, 15, 26, 6, k0, k1, 3);
  Rounds(x0, x1, 17, 29, 16, 24, k1, k2, 4);
  Rounds(x0, x1, 13, 15, 26, 6, k2, k0, 5);
  *out0 = x0;
  *out1 = x1;
}

// The row's normals for pairs [j0, j0 + n): za[i] at position j0 + i and
// zb[i] at j0 + i + half.
FKJAX_VECTOR_CLONES
void DrawBlock(uint32_t k0, uint32_t k1, uint32_t row, uint32_t j0, int n,
               float* za, float* zb) {
#pragma omp simd
  for (int i = 0; i < n; ++i) {
    uint32_t a, b;
    Threefry(k0, k1, row, j0 + static_cast<uint32_t>(i), &a, &b);
    za[i] = Normal(a);
    zb[i] = Normal(b);
  }
}

// Calls f(offset, z, count) over the row's positions, block by block, with
// z[i] the normal at position offset + i.
template <typename F>
void ForEachNormalBlock(uint32_t k0, uint32_t k1, int64_t row, int64_t cols,
                        F f) {
  const int64_t half = (cols + 1) / 2;
  float za[kBlock], zb[kBlock];
  for (int64_t j = 0; j < half; j += kBlock) {
    int n = static_cast<int>(half - j < kBlock ? half - j : kBlock);
    DrawBlock(k0, k1, static_cast<uint32_t>(row), static_cast<uint32_t>(j), n,
              za, zb);
    f(j, za, n);
    // The second words fill positions half..cols-1 (one fewer when cols is
    // odd: the last pair's second word is dropped).
    int64_t nb = cols - half - j;
    if (nb > 0) f(j + half, zb, static_cast<int>(nb < n ? nb : n));
  }
}

FKJAX_VECTOR_CLONES
void RowMoments(const float* x, int64_t cols, double* sum, double* sq_dev) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < cols; ++i) s += x[i];
  const double mean = s / static_cast<double>(cols);
  double q = 0.0;
#pragma omp simd reduction(+ : q)
  for (int64_t i = 0; i < cols; ++i) {
    double d = x[i] - mean;
    q += d * d;
  }
  *sum = s;
  *sq_dev = q;
}

FKJAX_VECTOR_CLONES
void AddScaled(const float* x, const float* z, float scale, int n, float* y,
               float* z_out) {
  if (z_out == nullptr) {
#pragma omp simd
    for (int i = 0; i < n; ++i) y[i] = x[i] + scale * z[i];
    return;
  }
#pragma omp simd
  for (int i = 0; i < n; ++i) {
    y[i] = x[i] + scale * z[i];
    z_out[i] = z[i];
  }
}

FKJAX_VECTOR_CLONES
double Dot(const float* g, const float* z, int64_t n) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(g[i]) * z[i];
  return s;
}

FKJAX_VECTOR_CLONES
void AddCentred(const float* g, const float* x, float k, float mean,
                int64_t cols, float* dx) {
#pragma omp simd
  for (int64_t i = 0; i < cols; ++i) dx[i] = g[i] + k * (x[i] - mean);
}

struct Shape {
  int64_t rows, cols;
};

ffi::Error RowsCols(ffi::Span<const int64_t> dims, Shape* s) {
  if (dims.size() < 1) {
    return ffi::Error::InvalidArgument("noise injection needs a batch axis");
  }
  *s = {dims[0], 1};
  for (size_t i = 1; i < dims.size(); ++i) s->cols *= dims[i];
  if (s->rows >= (int64_t{1} << 32) || s->cols >= (int64_t{1} << 33)) {
    return ffi::Error::InvalidArgument("too large for 32-bit counters");
  }
  return ffi::Error::Success();
}

// z, when not empty, receives z for the backward pass.
ffi::Error Forward(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U32> key,
                   ffi::ResultBuffer<ffi::F32> y,
                   ffi::ResultBuffer<ffi::F32> z,
                   ffi::ResultBuffer<ffi::F32> stats, float coef,
                   bool per_example) {
  Shape shape;
  ffi::Error error = RowsCols(x.dimensions(), &shape);
  if (error.failure()) return error;
  if (key.element_count() != 2) {
    return ffi::Error::InvalidArgument("the key must be threefry's 2 words");
  }
  const int64_t rows = shape.rows, cols = shape.cols;
  if (z->element_count() != 0 && z->element_count() != x.element_count()) {
    return ffi::Error::InvalidArgument("z must be empty or x's size");
  }
  const uint32_t* k = key.typed_data();
  const float* xs = x.typed_data();
  float* ys = y->typed_data();
  float* zs = z->element_count() == 0 ? nullptr : z->typed_data();
  float* st = stats->typed_data();
  std::vector<double> sums(rows), sq_devs(rows);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    RowMoments(xs + r * cols, cols, &sums[r], &sq_devs[r]);
  }
  if (per_example) {
    for (int64_t r = 0; r < rows; ++r) {
      st[2 * r] = static_cast<float>(sums[r] / cols);
      st[2 * r + 1] = static_cast<float>(std::sqrt(sq_devs[r] / cols));
    }
  } else {
    // Chan et al.'s pairwise combination, in row order (deterministic).
    const double n = static_cast<double>(rows) * cols;
    double mean = 0.0;
    for (int64_t r = 0; r < rows; ++r) mean += sums[r];
    mean /= n;
    double m2 = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      double d = sums[r] / cols - mean;
      m2 += sq_devs[r] + cols * d * d;
    }
    st[0] = static_cast<float>(mean);
    st[1] = static_cast<float>(std::sqrt(m2 / n));
  }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = coef * st[per_example ? 2 * r + 1 : 1];
    const float* xr = xs + r * cols;
    float* yr = ys + r * cols;
    float* zr = zs == nullptr ? nullptr : zs + r * cols;
    ForEachNormalBlock(k[0], k[1], r, cols,
                       [&](int64_t at, const float* z, int n) {
                         AddScaled(xr + at, z, scale, n, yr + at,
                                   zr == nullptr ? nullptr : zr + at);
                       });
  }
  return ffi::Error::Success();
}

// dx = dy + c * <dy, z>_group / (n_group * std_group) * (x - mean_group):
// the derivative of std(x) is (x - mean) / (n std). A group with zero
// spread gets no std gradient.
ffi::Error Backward(ffi::Buffer<ffi::F32> dy, ffi::Buffer<ffi::F32> x,
                    ffi::Buffer<ffi::F32> z, ffi::Buffer<ffi::F32> stats,
                    ffi::ResultBuffer<ffi::F32> dx, float coef,
                    bool per_example) {
  Shape shape;
  ffi::Error error = RowsCols(x.dimensions(), &shape);
  if (error.failure()) return error;
  const int64_t rows = shape.rows, cols = shape.cols;
  const float* zs = z.typed_data();
  const float* gs = dy.typed_data();
  const float* xs = x.typed_data();
  const float* st = stats.typed_data();
  float* dxs = dx->typed_data();
  std::vector<double> dots(rows);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    dots[r] = Dot(gs + r * cols, zs + r * cols, cols);
  }
  double total = 0.0;
  if (!per_example) {
    for (int64_t r = 0; r < rows; ++r) total += dots[r];
  }
  const double group = per_example ? cols : static_cast<double>(rows) * cols;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t s = per_example ? r : 0;
    const double std = st[2 * s + 1];
    const double dot = per_example ? dots[r] : total;
    const float kr =
        std > 0.0 ? static_cast<float>(coef * dot / (group * std)) : 0.0f;
    AddCentred(gs + r * cols, xs + r * cols, kr, st[2 * s], cols,
               dxs + r * cols);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(FkjaxNoiseInjectFwd, Forward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("coef")
                                  .Attr<bool>("per_example"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(FkjaxNoiseInjectBwd, Backward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("coef")
                                  .Attr<bool>("per_example"));
