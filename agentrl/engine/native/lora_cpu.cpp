// agentrl's CPU LoRA kernel: one call per LoRA layer for a step's slot groups (one slot or several).
//
// y[row, off_i : off_i + size_i] += scale * B_i[slot] (A_i[slot] x[row])   for every slice i of the layer,
// for the token rows of each slot group (rows of no adapter are in no group: nothing is added to them).
//
// The groups come sorted by slot (agentrl.engine.cpu_lora.Groups): `order` holds the token rows, slot group g
// owning order[offsets[g] : offsets[g + 1]] and slot slots[g]. A_i is a (slots, 1, R, in) tensor whose last
// dimension is contiguous, B_i a (slots, 1, out, R) one, each slot's matrix read where its strides put it (the
// one-copy slot layout interleaves the slots of every tensor). The caller runs it for one slot's small work
// (decode), on one thread, where one OpenMP region per GEMM costs more than the GEMM, and for several slots' work
// at any size, on `threads` threads for large calls (agentrl.engine.cpu_lora).
//
// Loops are written for the compiler's vectoriser (-O3): the shrink is a dot product over `in` per (token,
// rank row), the expand a dot product over R per (output, token) with each B row loaded once per group.

#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t k = 0; k < n; ++k) acc += a[k] * b[k];
  return acc;
}

template <int64_t R>
inline float dot_fixed(const float* __restrict a, const float* __restrict b) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t k = 0; k < R; ++k) acc += a[k] * b[k];
  return acc;
}

// y rows += h (n x R, row-major) @ B^T, B rows of stride ldb; `size` outputs from column 0 of `y`.
template <int64_t R>
void expand_fixed(float* y, int64_t ldy, const int64_t* rows, int64_t n, const float* h, const float* b,
                  int64_t ldb, int64_t size) {
  for (int64_t o = 0; o < size; ++o) {
    const float* brow = b + o * ldb;
    for (int64_t t = 0; t < n; ++t) y[rows[t] * ldy + o] += dot_fixed<R>(brow, h + t * R);
  }
}

void expand_any(float* y, int64_t ldy, const int64_t* rows, int64_t n, const float* h, const float* b,
                int64_t ldb, int64_t size, int64_t rank) {
  for (int64_t o = 0; o < size; ++o) {
    const float* brow = b + o * ldb;
    for (int64_t t = 0; t < n; ++t) y[rows[t] * ldy + o] += dot(brow, h + t * rank, rank);
  }
}

void expand(float* y, int64_t ldy, const int64_t* rows, int64_t n, const float* h, const float* b, int64_t ldb,
            int64_t size, int64_t rank) {
  switch (rank) {
    case 8: return expand_fixed<8>(y, ldy, rows, n, h, b, ldb, size);
    case 16: return expand_fixed<16>(y, ldy, rows, n, h, b, ldb, size);
    case 32: return expand_fixed<32>(y, ldy, rows, n, h, b, ldb, size);
    case 64: return expand_fixed<64>(y, ldy, rows, n, h, b, ldb, size);
    default: return expand_any(y, ldy, rows, n, h, b, ldb, size, rank);
  }
}

#if defined(__AVX512F__)
#include <immintrin.h>

// The 16 x 16 tile at `src` (rows `ld` floats apart) transposed into r[0..15] (r[j][i] = src[i * ld + j]).
inline void transpose16(const float* src, int64_t ld, __m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * ld);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    for (int j = 0; j < 2; ++j) {
      r[i + 2 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + j]), _mm512_castps_pd(t[i + j + 2])));
      r[i + 2 * j + 1] =
          _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + j]), _mm512_castps_pd(t[i + j + 2])));
    }
  }
  // r[4b + c] now holds, in each 128-bit lane q, column 4q + c of rows 4b..4b+3 (b: a block of 4 rows).
  for (int h = 0; h < 2; ++h)
    for (int c = 0; c < 4; ++c) {
      t[8 * h + c] = _mm512_shuffle_f32x4(r[8 * h + c], r[8 * h + 4 + c], 0x88);
      t[8 * h + 4 + c] = _mm512_shuffle_f32x4(r[8 * h + c], r[8 * h + 4 + c], 0xdd);
    }
  for (int c = 0; c < 8; ++c) {
    r[c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88);
    r[8 + c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0xdd);
  }
}

// h (n x rank) = scale * x[rows] @ A^T, A (rank x in, rows lda apart); rank a multiple of 16: each 16 x 16 tile
// of A is transposed once per group and applied to the group's tokens with broadcast FMAs.
void shrink16(float* h, const float* x, int64_t ldx, const int64_t* rows, int64_t n, const float* a, int64_t lda,
              int64_t rank, int64_t in, float scale) {
  const int64_t full = in - in % 16;
  __m512 col[16];
  for (int64_t r0 = 0; r0 < rank; r0 += 16) {
    for (int64_t t = 0; t < n; ++t) _mm512_storeu_ps(h + t * rank + r0, _mm512_setzero_ps());
    for (int64_t k0 = 0; k0 < full; k0 += 16) {
      transpose16(a + r0 * lda + k0, lda, col);  // col[j]: A[r0..r0+15, k0 + j]
      for (int64_t t = 0; t < n; ++t) {
        const float* xr = x + rows[t] * ldx + k0;
        __m512 acc = _mm512_loadu_ps(h + t * rank + r0);
        for (int j = 0; j < 16; ++j) acc = _mm512_fmadd_ps(_mm512_set1_ps(xr[j]), col[j], acc);
        _mm512_storeu_ps(h + t * rank + r0, acc);
      }
    }
    for (int64_t t = 0; t < n; ++t) {
      const float* xr = x + rows[t] * ldx;
      for (int64_t r = r0; r < r0 + 16; ++r) {
        float tail = 0.f;
        for (int64_t k = full; k < in; ++k) tail += a[r * lda + k] * xr[k];
        h[t * rank + r] = (h[t * rank + r] + tail) * scale;
      }
    }
  }
}

// y[rows, 0:size] += h (n x rank) @ B^T, B (size x rank, rows ldb apart); rank a multiple of 16: each 16 x 16
// tile of B is transposed once per group, a token's 16 outputs accumulated in one register.
void expand16(float* y, int64_t ldy, const int64_t* rows, int64_t n, const float* h, const float* b, int64_t ldb,
              int64_t size, int64_t rank) {
  const int64_t full = size - size % 16;
  __m512 col[16];
  for (int64_t o0 = 0; o0 < full; o0 += 16) {
    for (int64_t r0 = 0; r0 < rank; r0 += 16) {
      transpose16(b + o0 * ldb + r0, ldb, col);  // col[j]: B[o0..o0+15, r0 + j]
      for (int64_t t = 0; t < n; ++t) {
        const float* ht = h + t * rank + r0;
        float* yr = y + rows[t] * ldy + o0;
        __m512 acc = _mm512_loadu_ps(yr);
        for (int j = 0; j < 16; ++j) acc = _mm512_fmadd_ps(_mm512_set1_ps(ht[j]), col[j], acc);
        _mm512_storeu_ps(yr, acc);
      }
    }
  }
  for (int64_t o = full; o < size; ++o)
    for (int64_t t = 0; t < n; ++t) y[rows[t] * ldy + o] += dot(b + o * ldb, h + t * rank, rank);
}
#endif

void check_stacked(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.scalar_type() == torch::kFloat32, what, " must be float32");
  TORCH_CHECK(t.device().is_cpu(), what, " must be on the CPU");
  TORCH_CHECK(t.dim() == 4 && t.size(1) == 1, what, " must be (slots, 1, rows, cols)");
  TORCH_CHECK(t.stride(3) == 1, what, "'s last dimension must be contiguous");
}

}  // namespace

// The LoRA of one layer for a step's slot groups; `y` (tokens x width, last dimension contiguous) in place.
void lora_groups(torch::Tensor y, torch::Tensor x, std::vector<torch::Tensor> a, std::vector<torch::Tensor> b,
                 torch::Tensor order, torch::Tensor offsets, torch::Tensor slots, double scale,
                 std::vector<int64_t> sizes, int64_t offset, int64_t threads) {
  TORCH_CHECK(y.scalar_type() == torch::kFloat32 && x.scalar_type() == torch::kFloat32, "y and x must be float32");
  TORCH_CHECK(y.dim() == 2 && x.dim() == 2 && y.stride(1) == 1 && x.stride(1) == 1,
              "y and x must be 2-D with contiguous rows");
  TORCH_CHECK(a.size() == b.size() && a.size() == sizes.size() && !a.empty(), "one A, one B and one size per slice");
  TORCH_CHECK(order.scalar_type() == torch::kInt64 && offsets.scalar_type() == torch::kInt64 &&
                  slots.scalar_type() == torch::kInt64 && order.is_contiguous() && offsets.is_contiguous() &&
                  slots.is_contiguous(),
              "order, offsets and slots must be contiguous int64");
  const int64_t groups = slots.numel();
  TORCH_CHECK(offsets.numel() == groups + 1, "offsets must have one entry more than slots");
  const int64_t in = x.size(1);
  int64_t width = offset;
  for (size_t i = 0; i < a.size(); ++i) {
    check_stacked(a[i], "A");
    check_stacked(b[i], "B");
    TORCH_CHECK(a[i].size(3) == in, "A's columns must be x's width");
    TORCH_CHECK(b[i].size(3) == a[i].size(2), "B's columns must be A's rows (the rank)");
    TORCH_CHECK(sizes[i] <= b[i].size(2), "a slice's size must not exceed B's rows");
    width += sizes[i];
  }
  TORCH_CHECK(width <= y.size(1), "the slices must fit in y's columns");
  const int64_t* ord = order.data_ptr<int64_t>();
  const int64_t* off = offsets.data_ptr<int64_t>();
  const int64_t* sl = slots.data_ptr<int64_t>();
  TORCH_CHECK(off[0] == 0 && off[groups] <= order.numel(), "offsets must index order");
  const int64_t tokens = x.size(0);
  for (int64_t g = 0; g < groups; ++g) {
    TORCH_CHECK(off[g] <= off[g + 1], "offsets must not decrease");
    for (int64_t k = off[g]; k < off[g + 1]; ++k)
      TORCH_CHECK(ord[k] >= 0 && ord[k] < tokens && ord[k] < y.size(0), "a token row out of range");
    for (size_t i = 0; i < a.size(); ++i)
      TORCH_CHECK(sl[g] >= 0 && sl[g] < a[i].size(0) && sl[g] < b[i].size(0), "a slot out of range");
  }
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t ldx = x.stride(0), ldy = y.stride(0);
  // Work items: a slot group's rows in chunks of kChunk tokens. Items own disjoint rows of y, so they run in any
  // order on any thread; with `threads` > 1 (the caller's choice: large calls) on an OpenMP team of that many
  // (torch's OpenMP runtime, whose threads the engine pinned), else on the calling thread alone.
  constexpr int64_t kChunk = 32;
  std::vector<int64_t> item_group, item_first;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t k = off[g]; k < off[g + 1]; k += kChunk) {
      item_group.push_back(g);
      item_first.push_back(k);
    }
  const int64_t items = static_cast<int64_t>(item_group.size());
  const int team = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, items)));
#pragma omp parallel num_threads(team) if (team > 1)
  {
    std::vector<float> h;
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t g = item_group[it];
      const int64_t first = item_first[it];
      const int64_t n = std::min(kChunk, off[g + 1] - first);
      const int64_t* rows = ord + first;
      int64_t col = offset;
      for (size_t i = 0; i < a.size(); ++i) {
        const int64_t rank = a[i].size(2);
        const float* ap = a[i].data_ptr<float>() + sl[g] * a[i].stride(0);
        const float* bp = b[i].data_ptr<float>() + sl[g] * b[i].stride(0);
        const int64_t lda = a[i].stride(2), ldb = b[i].stride(2);
        h.resize(static_cast<size_t>(n * rank));
#if defined(__AVX512F__)
        if (rank % 16 == 0) {
          shrink16(h.data(), xp, ldx, rows, n, ap, lda, rank, in, static_cast<float>(scale));
          expand16(yp + col, ldy, rows, n, h.data(), bp, ldb, sizes[i], rank);
          col += sizes[i];
          continue;
        }
#endif
        for (int64_t t = 0; t < n; ++t) {
          const float* xr = xp + rows[t] * ldx;
          for (int64_t r = 0; r < rank; ++r) h[t * rank + r] = static_cast<float>(scale) * dot(ap + r * lda, xr, in);
        }
        expand(yp + col, ldy, rows, n, h.data(), bp, ldb, sizes[i], rank);
        col += sizes[i];
      }
    }
  }
}

// The rank multiple the vector path takes (16 where built with AVX-512), 0 where only the plain loops are built:
// the caller keeps its torch ops for other ranks, where the plain loops lose to them.
int64_t tile() {
#if defined(__AVX512F__)
  return 16;
#else
  return 0;
#endif
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("lora_groups", &lora_groups, "The LoRA of one layer for a step's slot groups (agentrl.engine.cpu_lora)");
  m.def("tile", &tile, "The rank multiple the vector path takes; 0: none built");
}
