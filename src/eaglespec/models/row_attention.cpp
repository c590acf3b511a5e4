// Attention for decoding and verification on CPUs, one query row at a time.
//
// out[b, h, r] = sum_j softmax_j(scale * q[b, h, r] . k[b, h, j]) v[b, h, j] over the keys j the
// row sees, visited in slot order, in fp32. A row's numbers depend only on its query and the keys
// it sees, in their order: not on how many rows the call carries, nor on masked keys between
// them. So a node verified inside a draft tree (whose ancestors sit in slot order, parents first)
// gets exactly what decoding its path one token at a time gets, in any dtype.
//
// Fixed summation orders: dot products over 8 interleaved partial sums combined in one order,
// then two passes over the visible keys (max, then exponentials and the weighted sum of values).
// With AVX-512 or AVX2 (head sizes a multiple of 8 up to 256 there) the keys of a kv head are read
// once for all its rows, in blocks, and the exponentials are vectorized (fixed polynomials); the
// plain loop runs elsewhere. On an AVX2 CPU (AMD Zen 2, SmolLM2 at 512 cached tokens, bf16, ad hoc)
// the vectorized path cut attention from 2.1 to 1.9 ms a one-token forward and from 12.6 to 7.2 ms
// an 8-token one: the whole forward 15.3 -> 14.3 ms (1 token), 20.2 -> 18.1 (2), 42.6 -> 36.2 (8).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

constexpr int LANES = 8;

template <typename T>
inline float dot(const float* q, const T* k, int64_t D) {
  float lanes[LANES] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t d = 0;
  for (; d + LANES <= D; d += LANES)
    for (int l = 0; l < LANES; ++l) lanes[l] += q[d + l] * static_cast<float>(k[d + l]);
  for (; d < D; ++d) lanes[d % LANES] += q[d] * static_cast<float>(k[d]);
  return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}

// Raw pointers and strides of row_attention's operands: q, k, v [B, H, rows or keys, D], out like
// q, mask bool [1 or B, rows, keys] or undefined.
template <typename T>
struct Operands {
  const T* q;
  const T* k;
  const T* v;
  T* out;
  const bool* mask;
  int64_t mask_batch;  // the mask's batch stride (0: one mask for every batch row)
  std::vector<int64_t> qs, ks, vs, os;
  Operands(const torch::Tensor& q_, const torch::Tensor& k_, const torch::Tensor& v_, const torch::Tensor& mask_,
           torch::Tensor& out_)
      : q(q_.data_ptr<T>()), k(k_.data_ptr<T>()), v(v_.data_ptr<T>()), out(out_.data_ptr<T>()),
        mask(mask_.defined() ? mask_.data_ptr<bool>() : nullptr),
        mask_batch(mask_.defined() && mask_.size(0) > 1 ? mask_.stride(0) : 0),
        qs(q_.strides().vec()), ks(k_.strides().vec()), vs(v_.strides().vec()), os(out_.strides().vec()) {}
};

template <typename T>
void attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& mask,
            torch::Tensor& out, double scale) {
  const int64_t B = q.size(0), H = q.size(1), M = q.size(2), D = q.size(3), S = k.size(2);
  const Operands<T> o(q, k, v, mask, out);
  at::parallel_for(0, B * H * M, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> query(D), acc(D), scores(S);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / (H * M), h = (row / M) % H, r = row % M;
      const T* qrow = o.q + b * o.qs[0] + h * o.qs[1] + r * o.qs[2];
      for (int64_t d = 0; d < D; ++d) query[d] = static_cast<float>(qrow[d]) * static_cast<float>(scale);
      const bool* visible = o.mask ? o.mask + b * o.mask_batch + r * S : nullptr;
      const T* kbase = o.k + b * o.ks[0] + h * o.ks[1];
      const T* vbase = o.v + b * o.vs[0] + h * o.vs[1];
      float top = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < S; ++j) {
        if (visible && !visible[j]) continue;
        scores[j] = dot(query.data(), kbase + j * o.ks[2], D);
        top = scores[j] > top ? scores[j] : top;
      }
      float total = 0;
      for (int64_t d = 0; d < D; ++d) acc[d] = 0;
      for (int64_t j = 0; j < S; ++j) {
        if (visible && !visible[j]) continue;
        const float e = std::exp(scores[j] - top);
        total += e;
        const T* vrow = vbase + j * o.vs[2];
        for (int64_t d = 0; d < D; ++d) acc[d] += e * static_cast<float>(vrow[d]);
      }
      T* orow = o.out + b * o.os[0] + h * o.os[1] + r * o.os[2];  // a row that sees no key gets zeros
      for (int64_t d = 0; d < D; ++d) orow[d] = static_cast<T>(total > 0 ? acc[d] / total : 0.0f);
    }
  });
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// The same contract with AVX-512 (F, BW, VL), in two passes, for any D <= 256:
// 1. scores s[r, j] = (scale q_r) . k_j for every row and every key, masked or not, but for the blocks
//    of 16 keys that a row does not see at all (a batch's rows see only their own keys): 16 keys at a
//    time, read in cache order; per key one fp32 chain over the 16-wide chunks of d, then its 16
//    lanes summed by one fixed tree (a function of q_r and k_j alone);
// 2. per row, over its visible keys: the max, e_j = exp(s_j - max) by one fixed polynomial (0 for a
//    key it does not see), the normalizer summed in lanes chosen by the visible key's index among
//    the visible ones, and out = sum_j e_j v_j as one chain per output over the keys in slot order,
//    where the keys it does not see add exact zeros (skipped, blocks of 16 that none of the four
//    rows sees). Rows of a kv head run four at a time against each value, each row's chains the same
//    as alone.
// So a row's numbers depend on its query and its visible keys, in order, alone.

inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(const at::BFloat16* p, __mmask16 m) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

// exp(x) for x <= 0 (0 below -87): 2^n * p(r), x = n ln2 + r, |r| <= ln2 / 2, p of degree 6.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

inline __mmask16 first(int64_t n) { return static_cast<__mmask16>(n >= 16 ? 0xFFFF : n > 0 ? (1u << n) - 1 : 0); }

// Which of keys j..j+15 (< S) a row sees: its mask bytes (null: all keys).
inline __mmask16 seen(const bool* visible, int64_t j, int64_t S) {
  const __mmask16 in = first(S - j);
  if (!visible) return in;
  const __m128i bytes = _mm_maskz_loadu_epi8(in, visible + j);
  return _mm_test_epi8_mask(bytes, bytes);
}

// The 16 keys i = 0..n-1 (n <= 16) at kbase + i * stride, read in order (one stream, as the cache
// holds them) as fp32 in CHUNKS vectors each: kf[i * CHUNKS + c] (zeros past D and for i >= n).
template <typename T, int64_t CHUNKS>
inline void load_keys(const T* kbase, int64_t stride, int64_t n, const __mmask16* lanes, __m512* kf) {
  for (int64_t i = 0; i < 16; ++i) {
    // the cache streams from memory: ask for the keys two blocks ahead (prefetches never fault)
    for (int64_t l = 0; l < CHUNKS * 16 * int64_t(sizeof(T)); l += 64)
      _mm_prefetch(reinterpret_cast<const char*>(kbase + (i + 32) * stride) + l, _MM_HINT_T0);
    for (int64_t c = 0; c < CHUNKS; ++c)
      kf[i * CHUNKS + c] = i < n ? load16(kbase + i * stride + 16 * c, lanes[c]) : _mm512_setzero_ps();
  }
}

// Sixteen vectors p[0..15] -> one vector whose lane i is the sum of p[i]'s 16 lanes, by one fixed tree:
// within each 128-bit block lanes (0 + 2) + (1 + 3), then blocks (0 + 1) + (2 + 3).
inline __m512 sum16(const __m512* p) {
  __m512 pair[8], quad[4];
  for (int i = 0; i < 8; ++i)
    pair[i] = _mm512_add_ps(_mm512_unpacklo_ps(p[2 * i], p[2 * i + 1]), _mm512_unpackhi_ps(p[2 * i], p[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(pair[2 * i]), b = _mm512_castps_pd(pair[2 * i + 1]);
    quad[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // quad[g]: per 128-bit block b, the block's sums of keys 4g..4g+3
  const __m512 lo = _mm512_add_ps(_mm512_shuffle_f32x4(quad[0], quad[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(quad[0], quad[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 hi = _mm512_add_ps(_mm512_shuffle_f32x4(quad[2], quad[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(quad[2], quad[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(lo, hi, _MM_SHUFFLE(3, 1, 3, 1)));
}

// One query row (scaled, fp32, CHUNKS vectors) against a block of 16 loaded keys: s[i] = the sum
// over the 16 lanes (sum16) of the chain q[c] k_i[c] over the chunks c in order.
template <int64_t CHUNKS>
inline void block_scores(const __m512* q, const __m512* kf, float* s) {
  __m512 p[16];
  for (int64_t i = 0; i < 16; ++i) {
    __m512 acc = _mm512_mul_ps(q[0], kf[i * CHUNKS]);
    for (int64_t c = 1; c < CHUNKS; ++c) acc = _mm512_fmadd_ps(q[c], kf[i * CHUNKS + c], acc);
    p[i] = acc;
  }
  _mm512_storeu_ps(s, sum16(p));
}

// R rows' outputs over D = 16 * CHUNKS (zero-padded) lanes: acc[r][c] += e[r][j] v_j, keys in order,
// each row past the blocks of 16 keys it does not see (`live[block]`: bit r set where row r sees one of
// the block's keys; null: every row every block), whose weights are exact zeros.
template <typename T, int64_t CHUNKS, int R>
inline void weighted_values(const float* const* e, const T* vbase, int64_t vstride, int64_t S,
                            const __mmask16* lanes, const unsigned char* live, float* const* out) {
  __m512 acc[R][CHUNKS];
  for (int r = 0; r < R; ++r)
    for (int64_t c = 0; c < CHUNKS; ++c) acc[r][c] = _mm512_setzero_ps();
  unsigned rows = (1u << R) - 1;
  for (int64_t j = 0; j < S; ++j) {
    if (live && j % 16 == 0) {
      rows = live[j / 16];
      if (!rows) {
        j += 15;
        continue;
      }
    }
    const T* value = vbase + j * vstride;
    for (int64_t l = 0; l < CHUNKS * 16 * int64_t(sizeof(T)); l += 64)  // values 32 keys ahead
      _mm_prefetch(reinterpret_cast<const char*>(value + 32 * vstride) + l, _MM_HINT_T0);
    __m512 weight[R];
    for (int r = 0; r < R; ++r) weight[r] = _mm512_set1_ps(e[r][j]);
    for (int64_t c = 0; c < CHUNKS; ++c) {
      const __m512 x = load16(value + 16 * c, lanes[c]);
      for (int r = 0; r < R; ++r)
        if (rows >> r & 1) acc[r][c] = _mm512_fmadd_ps(weight[r], x, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int64_t c = 0; c < CHUNKS; ++c) _mm512_storeu_ps(out[r] + 16 * c, acc[r][c]);
}

// CHUNKS = ceil(D / 16), a compile-time constant so that accumulators stay in registers.
template <typename T, int64_t CHUNKS>
void attend512(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& mask,
               torch::Tensor& out, double scale) {
  const int64_t B = q.size(0), H = q.size(1), M = q.size(2), D = q.size(3), S = k.size(2);
  const int64_t blocks = (S + 15) / 16;
  __mmask16 lanes[CHUNKS];  // chunk c's lanes inside D (chunks past ceil(D / 16) load zeros)
  for (int64_t c = 0; c < CHUNKS; ++c) lanes[c] = first(D - 16 * c);
  const Operands<T> o(q, k, v, mask, out);
  const int64_t ld = blocks * 16;  // a row's scores, padded to whole blocks
  std::vector<float> scores(B * H * M * ld);
  const float sc = static_cast<float>(scale);

  // 1. scores, per (b, h, block of 16 keys): the keys read once, every row against them
  at::parallel_for(0, B * H * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<__m512> kf(16 * CHUNKS);
    __m512 query[CHUNKS];
    for (int64_t item = begin; item < end; ++item) {
      const int64_t bh = item / blocks, block = item % blocks, b = bh / H, h = bh % H;
      const int64_t j0 = block * 16, n = S - j0 < 16 ? S - j0 : 16;
      // a block no row sees has no score to compute (the rows of a batch see only their own keys)
      const bool* rows_mask = o.mask ? o.mask + b * o.mask_batch : nullptr;
      bool any = !rows_mask;
      for (int64_t r = 0; r < M && !any; ++r) any = seen(rows_mask + r * S, j0, S) != 0;
      if (!any) continue;
      load_keys<T, CHUNKS>(o.k + b * o.ks[0] + h * o.ks[1] + j0 * o.ks[2], o.ks[2], n, lanes, kf.data());
      const T* qbase = o.q + b * o.qs[0] + h * o.qs[1];
      float* sbase = scores.data() + bh * M * ld + j0;
      for (int64_t r = 0; r < M; ++r) {
        if (rows_mask && !seen(rows_mask + r * S, j0, S)) continue;  // nor a row that does not see it
        for (int64_t c = 0; c < CHUNKS; ++c)
          query[c] = _mm512_mul_ps(load16(qbase + r * o.qs[2] + 16 * c, lanes[c]), _mm512_set1_ps(sc));
        block_scores<CHUNKS>(query, kf.data(), sbase + r * ld);
      }
    }
  });

  // 2. softmax weights and the weighted sum of values, per (b, h, group of 4 rows, half of the output
  //    lanes): each half computes its rows' weights itself (the same numbers), so that a decoding step's
  //    few (b, h) keep both threads busy
  //    Rows that see the same keys share a group where the mask says so (the rows of a packed batch see
  //    only their own): rows in order of the first key they see, so that a group reads one row's values,
  //    not four rows' (a row's numbers do not depend on its group: the others' weights there are 0).
  constexpr int64_t PARTS = CHUNKS >= 2 ? 2 : 1, PART = CHUNKS / PARTS;
  const int64_t groups = (M + 3) / 4;
  std::vector<int64_t> order(B * M);
  for (int64_t b = 0; b < B; ++b) {
    int64_t* rows = order.data() + b * M;
    std::vector<int64_t> start(M, 0);
    for (int64_t r = 0; r < M; ++r) {
      rows[r] = r;
      if (o.mask)
        while (start[r] < S && !o.mask[b * o.mask_batch + r * S + start[r]]) ++start[r];
    }
    std::stable_sort(rows, rows + M, [&](int64_t x, int64_t y) { return start[x] < start[y]; });
  }
  at::parallel_for(0, B * H * groups * PARTS, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> sums(4 * 16 * PART), packed(S + 16), weights(4 * ld);
    std::vector<unsigned char> live(blocks);  // per block of 16 keys: which rows of the group see it
    for (int64_t item = begin; item < end; ++item) {
      const int64_t part = item % PARTS, group = item / PARTS;
      const int64_t bh = group / groups, r0 = (group % groups) * 4, b = bh / H, h = bh % H;
      const int64_t R = M - r0 < 4 ? M - r0 : 4;
      const int64_t* rows = order.data() + b * M + r0;  // the group's rows
      float* e[4];
      float totals[4];
      for (int64_t r = 0; r < R; ++r) {
        const float* row_scores = scores.data() + (bh * M + rows[r]) * ld;
        e[r] = weights.data() + r * ld;
        const bool* visible = o.mask ? o.mask + b * o.mask_batch + rows[r] * S : nullptr;
        __m512 top = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
        for (int64_t j = 0; j < S; j += 16) {
          const __mmask16 m = seen(visible, j, S);
          top = _mm512_mask_max_ps(top, m, top, _mm512_maskz_loadu_ps(m, row_scores + j));
        }
        const __m512 peak = _mm512_set1_ps(_mm512_reduce_max_ps(top));
        int64_t count = 0;  // the row's visible weights, packed in key order: lane = index % 16
        for (int64_t j = 0; j < S; j += 16) {
          const __mmask16 m = seen(visible, j, S);
          if (!m) {  // a block the row does not see: zero weights
            _mm512_storeu_ps(e[r] + j, _mm512_setzero_ps());
            continue;
          }
          const __m512 w = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_loadu_ps(row_scores + j), peak)));
          _mm512_storeu_ps(e[r] + j, w);  // zeros past S and where the row does not see the key
          // compressed in a register, then stored whole (the buffer has 16 floats to spare): a compressing
          // store to memory is microcoded and slow on AMD Zen 4
          _mm512_storeu_ps(packed.data() + count, _mm512_maskz_compress_ps(m, w));
          count += _mm_popcnt_u32(m);
        }
        __m512 total = _mm512_setzero_ps();
        for (int64_t i = 0; i < count; i += 16) total = _mm512_add_ps(total, _mm512_maskz_loadu_ps(first(count - i), packed.data() + i));
        totals[r] = _mm512_reduce_add_ps(total);
      }
      if (o.mask) {
        for (int64_t block = 0; block < blocks; ++block) {
          live[block] = 0;
          for (int64_t r = 0; r < R; ++r)
            live[block] |= (seen(o.mask + b * o.mask_batch + rows[r] * S, block * 16, S) != 0) << r;
        }
      }
      const unsigned char* live_blocks = o.mask ? live.data() : nullptr;
      float* acc[4] = {sums.data(), sums.data() + 16 * PART, sums.data() + 32 * PART, sums.data() + 48 * PART};
      const int64_t d0 = part * PART * 16, d1 = std::min(D, d0 + PART * 16);  // this half's output lanes
      const T* vbase = o.v + b * o.vs[0] + h * o.vs[1] + d0;
      const __mmask16* part_lanes = lanes + part * PART;
      switch (R) {
        case 4: weighted_values<T, PART, 4>(e, vbase, o.vs[2], S, part_lanes, live_blocks, acc); break;
        case 3: weighted_values<T, PART, 3>(e, vbase, o.vs[2], S, part_lanes, live_blocks, acc); break;
        case 2: weighted_values<T, PART, 2>(e, vbase, o.vs[2], S, part_lanes, live_blocks, acc); break;
        default: weighted_values<T, PART, 1>(e, vbase, o.vs[2], S, part_lanes, live_blocks, acc); break;
      }
      for (int64_t r = 0; r < R; ++r) {
        T* orow = o.out + b * o.os[0] + h * o.os[1] + rows[r] * o.os[2];  // a row that sees no key gets zeros
        const float inv = totals[r] > 0 ? 1.0f / totals[r] : 0.0f;
        for (int64_t d = d0; d < d1; ++d) orow[d] = static_cast<T>(acc[r][d - d0] * inv);
      }
    }
  });
}
#elif defined(__AVX2__)
// The same contract with AVX2 (8 fp32 lanes), for D a multiple of 8 up to 256, in three steps:
// 1. scores s[r, j] = (scale q_r) . k_j for every row and every key, masked or not: 8 keys at a
//    time, read in cache order; per key one fp32 chain over the 8-wide chunks of d, then its 8 lanes
//    summed by one fixed tree (a function of q_r and k_j alone);
// 2. per row, over its visible keys: the max, e_j = exp(s_j - max) by one fixed polynomial (0 for a
//    key it does not see), and the normalizer summed in 8 lanes chosen by the visible key's index
//    among the visible ones;
// 3. out = sum_j e_j v_j as one chain per output over the keys in slot order (the keys a row does
//    not see add exact zeros), rows of a kv head four at a time against each value.
// So a row's numbers depend on its query and its visible keys, in order, alone.

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}

// exp(x) for x <= 0 (0 below -87): 2^n * p(r), x = n ln2 + r, |r| <= ln2 / 2, p of degree 6.
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  for (const float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));  // n >= -126: 2^n is a normal number
}

// Eight vectors p[0..7] -> one vector whose lane i is the sum of p[i]'s 8 lanes, by one fixed tree.
inline __m256 sum8(const __m256* p) {
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(p[0], p[1]), _mm256_hadd_ps(p[2], p[3]));
  const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(p[4], p[5]), _mm256_hadd_ps(p[6], p[7]));
  // a: lanes 0-3 the low halves' sums of p[0..3], lanes 4-7 their high halves'; b likewise for p[4..7]
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

// Which of keys j..j+7 (< S) a row sees, as all-ones lanes (null mask: all keys before S).
inline __m256 seen8(const bool* visible, int64_t j, int64_t S) {
  alignas(8) uint8_t bytes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < 8 && j + i < S; ++i) bytes[i] = visible ? visible[j + i] : 1;
  const __m256i lanes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes)));
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(lanes, _mm256_setzero_si256()));
}

// R rows' outputs over the 8-lane chunks [c0, c1): acc[r][c] += e[r][j] v_j, keys in order.
template <typename T, int R>
void weighted_values8(const float* const* e, const T* vbase, int64_t vstride, int64_t S, int64_t c0, int64_t c1,
                      float* const* out) {
  constexpr int64_t MAX = 4;  // chunks per call (the accumulators stay in registers)
  for (int64_t c = c0; c < c1; c += MAX) {
    const int64_t n = c1 - c < MAX ? c1 - c : MAX;
    __m256 acc[R][MAX];
    for (int r = 0; r < R; ++r)
      for (int64_t i = 0; i < MAX; ++i) acc[r][i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < S; ++j) {
      const T* value = vbase + j * vstride + 8 * c;
      _mm_prefetch(reinterpret_cast<const char*>(value + 16 * vstride), _MM_HINT_T0);
      __m256 weight[R];
      for (int r = 0; r < R; ++r) weight[r] = _mm256_broadcast_ss(e[r] + j);
      for (int64_t i = 0; i < n; ++i) {
        const __m256 x = load8(value + 8 * i);
        for (int r = 0; r < R; ++r) acc[r][i] = _mm256_fmadd_ps(weight[r], x, acc[r][i]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int64_t i = 0; i < n; ++i) _mm256_storeu_ps(out[r] + 8 * (c + i), acc[r][i]);
  }
}

template <typename T>
void attend_avx2(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& mask,
                 torch::Tensor& out, double scale) {
  const int64_t B = q.size(0), H = q.size(1), M = q.size(2), D = q.size(3), S = k.size(2), C = D / 8;
  const int64_t blocks = (S + 7) / 8, ld = blocks * 8;  // a row's scores, padded to whole blocks
  const Operands<T> o(q, k, v, mask, out);
  std::vector<float> query(B * H * M * D), scores(B * H * M * ld), totals(B * H * M);
  const float sc = static_cast<float>(scale);
  for (int64_t row = 0; row < B * H * M; ++row) {  // the scaled queries, fp32
    const int64_t b = row / (H * M), h = (row / M) % H, r = row % M;
    const T* qrow = o.q + b * o.qs[0] + h * o.qs[1] + r * o.qs[2];
    for (int64_t d = 0; d < D; ++d) query[row * D + d] = static_cast<float>(qrow[d]) * sc;
  }

  // 1. scores, per (b, h, block of 8 keys): the keys read once, every row against them
  at::parallel_for(0, B * H * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<__m256> kf(8 * C);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t bh = item / blocks, block = item % blocks, b = bh / H, h = bh % H;
      const int64_t j0 = block * 8, n = S - j0 < 8 ? S - j0 : 8;
      const T* kbase = o.k + b * o.ks[0] + h * o.ks[1] + j0 * o.ks[2];
      for (int64_t i = 0; i < 8; ++i) {
        for (int64_t l = 0; l < D * int64_t(sizeof(T)); l += 64)  // the keys two blocks ahead
          _mm_prefetch(reinterpret_cast<const char*>(kbase + (i + 16) * o.ks[2]) + l, _MM_HINT_T0);
        for (int64_t c = 0; c < C; ++c) kf[i * C + c] = i < n ? load8(kbase + i * o.ks[2] + 8 * c) : _mm256_setzero_ps();
      }
      for (int64_t r = 0; r < M; ++r) {
        const float* qrow = query.data() + (bh * M + r) * D;
        __m256 p[8];
        for (int64_t i = 0; i < 8; ++i) {
          __m256 acc = _mm256_mul_ps(load8(qrow), kf[i * C]);
          for (int64_t c = 1; c < C; ++c) acc = _mm256_fmadd_ps(load8(qrow + 8 * c), kf[i * C + c], acc);
          p[i] = acc;
        }
        _mm256_storeu_ps(scores.data() + (bh * M + r) * ld + j0, sum8(p));
      }
    }
  });

  // 2. per row: the max over its visible keys, the weights e (in place of the scores) and their sum
  at::parallel_for(0, B * H * M, 1, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / (H * M), r = row % M;
      const bool* visible = o.mask ? o.mask + b * o.mask_batch + r * S : nullptr;
      float* e = scores.data() + row * ld;
      const __m256 none = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
      __m256 top = none;
      for (int64_t j = 0; j < S; j += 8) top = _mm256_max_ps(top, _mm256_blendv_ps(none, _mm256_loadu_ps(e + j), seen8(visible, j, S)));
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, top);
      float peak = lanes[0];
      for (int i = 1; i < 8; ++i) peak = lanes[i] > peak ? lanes[i] : peak;
      const __m256 shift = _mm256_set1_ps(peak);
      alignas(32) float sums[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t count = 0;  // visible keys so far: key number `count` adds to lane count % 8
      for (int64_t j = 0; j < S; j += 8) {
        const __m256 in = seen8(visible, j, S);
        const __m256 w = _mm256_and_ps(in, exp8(_mm256_sub_ps(_mm256_loadu_ps(e + j), shift)));
        _mm256_storeu_ps(e + j, w);
        if (count % 8 == 0 && _mm256_movemask_ps(in) == 0xFF) {  // 8 visible keys in lanes 0..7: the same adds
          _mm256_store_ps(sums, _mm256_add_ps(_mm256_load_ps(sums), w));
          count += 8;
        } else {
          for (int64_t i = j; i < j + 8 && i < S; ++i)
            if (!visible || visible[i]) sums[count++ % 8] += e[i];
        }
      }
      totals[row] = ((sums[0] + sums[4]) + (sums[1] + sums[5])) + ((sums[2] + sums[6]) + (sums[3] + sums[7]));
    }
  });

  // 3. the weighted sums of values, per (b, h, group of 4 rows, a part of the output chunks), so that
  //    a decoding step's few (b, h) keep both threads busy
  const int64_t groups = (M + 3) / 4, PARTS = C >= 4 ? 4 : C, PART = (C + PARTS - 1) / PARTS;
  at::parallel_for(0, B * H * groups * PARTS, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> sums(4 * D);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t part = item % PARTS, group = item / PARTS;
      const int64_t bh = group / groups, r0 = (group % groups) * 4, b = bh / H, h = bh % H;
      const int64_t R = M - r0 < 4 ? M - r0 : 4;
      const int64_t c0 = part * PART, c1 = std::min(C, c0 + PART);
      const float* e[4];
      float* acc[4];
      for (int64_t r = 0; r < 4; ++r) e[r] = scores.data() + (bh * M + r0 + std::min(r, R - 1)) * ld, acc[r] = sums.data() + r * D;
      const T* vbase = o.v + b * o.vs[0] + h * o.vs[1];
      switch (R) {
        case 4: weighted_values8<T, 4>(e, vbase, o.vs[2], S, c0, c1, acc); break;
        case 3: weighted_values8<T, 3>(e, vbase, o.vs[2], S, c0, c1, acc); break;
        case 2: weighted_values8<T, 2>(e, vbase, o.vs[2], S, c0, c1, acc); break;
        default: weighted_values8<T, 1>(e, vbase, o.vs[2], S, c0, c1, acc); break;
      }
      for (int64_t r = 0; r < R; ++r) {
        T* orow = o.out + b * o.os[0] + h * o.os[1] + (r0 + r) * o.os[2];  // a row that sees no key gets zeros
        const float total = totals[bh * M + r0 + r], inv = total > 0 ? 1.0f / total : 0.0f;
        for (int64_t d = 8 * c0; d < 8 * c1; ++d) orow[d] = static_cast<T>(acc[r][d] * inv);
      }
    }
  });
}
#endif

}  // namespace

// q [B, H, M, D]; k, v [B, H, S, D] (last dim contiguous; a view of the cache is fine);
// mask: undefined (every key visible) or bool [1 or B, M, S], contiguous.
torch::Tensor row_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, c10::optional<torch::Tensor> mask,
                            double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be [B, H, rows, D]");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "the last dimension must be contiguous");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(), "q, k, v dtypes differ");
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), "row_attention runs on CPUs");
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3),
              "k and v must be [B, H, keys, D] with q's B, H and D (fold grouped query heads into rows)");
  torch::Tensor m;
  if (mask.has_value()) {
    m = mask->contiguous();
    TORCH_CHECK(m.scalar_type() == torch::kBool && m.dim() == 3 && (m.size(0) == 1 || m.size(0) == q.size(0)) &&
                    m.size(1) == q.size(2) && m.size(2) == k.size(2),
                "mask must be bool [1 or B, rows, keys]");
  }
  auto out = torch::empty_like(q, torch::MemoryFormat::Contiguous);
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  const int64_t D = q.size(3);
  if (D <= 256 && (q.scalar_type() == torch::kFloat || q.scalar_type() == torch::kBFloat16)) {
    const bool bf16 = q.scalar_type() == torch::kBFloat16;
    auto run = [&](auto chunks) {
      constexpr int64_t C = decltype(chunks)::value;
      if (bf16) attend512<at::BFloat16, C>(q, k, v, m, out, scale);
      else attend512<float, C>(q, k, v, m, out, scale);
    };
    if (D <= 16) run(std::integral_constant<int64_t, 1>());
    else if (D <= 32) run(std::integral_constant<int64_t, 2>());
    else if (D <= 64) run(std::integral_constant<int64_t, 4>());
    else if (D <= 128) run(std::integral_constant<int64_t, 8>());
    else run(std::integral_constant<int64_t, 16>());
    return out;
  }
#elif defined(__AVX2__)
  if (q.size(3) % 8 == 0 && q.size(3) <= 256) {
    if (q.scalar_type() == torch::kFloat) {
      attend_avx2<float>(q, k, v, m, out, scale);
      return out;
    }
    if (q.scalar_type() == torch::kBFloat16) {
      attend_avx2<at::BFloat16>(q, k, v, m, out, scale);
      return out;
    }
  }
#endif
  if (q.scalar_type() == torch::kFloat) {
    attend<float>(q, k, v, m, out, scale);
  } else if (q.scalar_type() == torch::kBFloat16) {
    attend<at::BFloat16>(q, k, v, m, out, scale);
  } else {
    TORCH_CHECK(false, "row_attention runs float32 and bfloat16");
  }
  return out;
}
