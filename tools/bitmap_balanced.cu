// Exploration (session 35, issue 4): the bitmap linear's decode done the way the sparse KV kernels do it
// (plugins/sparse_kv/sparse_kv.cu, RegDecode64), on *balanced* records: every 8 x 8 tile of W keeps exactly KEEP of
// its 64 weights, so a tile is a fixed-size record (8-byte bitmap, bit c' <=> tile position c' ^ x kept, position
// 8 r + c = row r, column c; then the KEEP values in ascending c' as fp16, zero-padded to a multiple of 4; x, the
// store order, in the last padding half where there is one, else 0) that one lane loads into registers and scatters
// into a dense 8 x 8 tile in shared memory (zero fill, then one 16-bit store per kept value by two bit walks, one
// from each end), which ldmatrix hands to mma.sync as the A operand (swap AB, as tactic 1: m16 = a strip pair,
// n8 = 8 rows of X, two n8 blocks for M up to 16). Not the shipped format: tools/bitmap_balanced_explore.py packs,
// checks and times it beside tactic 1 and cuBLAS on the same weights (docs/bitmap_linear.md, round 14).
//
// Records of a layer: record r = (p * KT + t) * 2 + s for strip pair p, k-tile t (KT = K / 8), strip s of the pair;
// stored chunk-major in groups of 16 (unit u = bytes 8u..8u+7 of record r at byte (r / 16) * 16 R + 128 u +
// 8 (r % 16)), so 16 lanes loading unit u read 128 contiguous bytes. Column c = 2 j + e of k-tile t = 16 i + 2 q + h
// is input channel 128 i + 32 j + 4 q + 2 h + e (the packer's permutation), so that a lane's X pairs are contiguous.
// Limits of the prototype: fp16 X and values (scale 1, no bias), M <= 16, K % 128 == 0, N % 16 == 0.
// Ampere instructions only (ld.global.nc, st.shared, ldmatrix, mma.sync).
#include <cuda_fp16.h>
#include <stdint.h>

namespace {

constexpr int kTileStride = 144;

// Timing ablations (tools/bitmap_balanced_explore.py --ablate; wrong results by design): bit 1 no zero fill; 2 no
// scatter stores (the walk and its addresses kept live); 4 the scatter's stores conflict-free (each lane to its own
// bank); 8 no record loads (a fixed 19-bit pattern); 16 no ldmatrix / mma (the tiles kept live); 32 conflict-free
// stores whose address still waits for the walk (an opaque and-with-zero of it); 64 stores at fixed positions of the
// lane's tile (put k of a lane at position (5 k + 3 lane) % 64: bank conflicts like random data's, no wait for the walk).
#ifndef BAL_ABL
#define BAL_ABL 0
#endif  // bytes per 8 x 8 tile slot: 128 + 16 (tile bases 4 banks apart)

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ uint2 ldg_nc8(const void* p) {
  uint2 r;
  asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];\n" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}

__device__ __forceinline__ void sts16(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(addr), "h"(static_cast<unsigned short>(v)) : "memory");
}

__device__ __forceinline__ void sts128_zero(uint32_t addr) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0u) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One walk over a tile's two stored bitmap words (REV: bit-reversed words, i.e. from the top bit down): the logic of
// AscWalk64 in plugins/sparse_kv/sparse_kv.cu, copied rather than shared so that this tool's timing ablations
// (BAL_ABL) can change its store without touching the plugin. put() stores v at
// the next set bit; the walk moves to the second word when the first runs out (never read past the last bit: the
// two walks together make exactly KEEP puts).
template <bool REV>
struct Walk {
  uint32_t cur, nxt, rb, rnx, xl, cfa, fixed;
  // x: the record's store order (bit c' of the stored bitmap = position c' ^ x; docs/sparse_kv.md, session 33):
  // stored word k holds the positions of tile word k ^ (x >> 5), which the caller's r_first / r_second say.
  __device__ __forceinline__ void init(uint32_t first, uint32_t second, uint32_t r_first, uint32_t r_second,
                                       uint32_t x) {
    xl = REV ? x & 31u : 31u ^ (x & 31u);
    cur = first != 0u ? first : second;
    rb = first != 0u ? r_first : r_second;
    nxt = second;
    rnx = r_second;
  }
  __device__ __forceinline__ void put(uint32_t v) {
    const uint32_t nc = cur & (cur - 1u);
    const uint32_t c = __clz(cur ^ nc) ^ xl;  // position in the tile word: (31 - clz) ^ x, or clz ^ x (REV)
#if BAL_ABL & 2
    asm volatile("" ::"r"(rb + 2u * c), "r"(v));
#elif BAL_ABL & 4
    asm volatile("" ::"r"(rb + 2u * c));
    sts16(cfa, v);
#elif BAL_ABL & 32
    uint32_t zero;
    asm volatile("and.b32 %0, %1, 0;" : "=r"(zero) : "r"(rb + 2u * c));
    sts16(cfa + zero, v);
#elif BAL_ABL & 64
    asm volatile("" ::"r"(rb + 2u * c));
    sts16(cfa + fixed, v);
    fixed = (fixed + 10u) & 127u;
#else
    sts16(rb + 2u * c, v);
#endif
    const bool z = nc == 0u;
    cur = z ? nxt : nc;
    rb = z ? rnx : rb;
  }
};

template <int KEEP>
struct Rec {
  static constexpr int KP = (KEEP + 3) & ~3;
  static constexpr int R = 8 + 2 * KP;  // bytes
  static constexpr int U = R / 8;       // 8-byte units
  static constexpr int NW = 2 * U;      // 32-bit words
};

// Zero the lane's tile, then scatter its KEEP values (value j = half j % 2 of word 2 + j / 2).
template <int KEEP>
__device__ __forceinline__ void decode_tile(const uint32_t (&w)[Rec<KEEP>::NW], uint32_t tile) {
#if !(BAL_ABL & 1)
#pragma unroll
  for (int i = 0; i < 8; ++i) sts128_zero(tile + 16 * i);
#endif
  Walk<false> a;
  Walk<true> d;
  // the store order x in the last padding half (records with keep % 4 != 0; 0 = positions in ascending order)
  const uint32_t x = Rec<KEEP>::KP > KEEP ? (w[Rec<KEEP>::NW - 1] >> 16) & 63u : 0u;
  const uint32_t t0 = tile + 64 * (x >> 5), t1 = tile + 64 - 64 * (x >> 5);  // tile words of stored words 0, 1
  a.init(w[0], w[1], t0, t1, x);
  d.init(__brev(w[1]), __brev(w[0]), t1, t0, x);
  a.cfa = tile - (threadIdx.x & 31) * (kTileStride - 4);  // buffer + 4 lane: bank = lane
  d.cfa = a.cfa;
#if BAL_ABL & 64
  a.cfa = d.cfa = tile;
  a.fixed = (6u * (threadIdx.x & 31)) & 127u;
  d.fixed = (a.fixed + 64u) & 127u;
#endif
  constexpr int A = KEEP / 2;  // values 0 .. A-1 ascending, KEEP-1 .. A descending
#pragma unroll
  for (int k = 0; k < KEEP - A; ++k) {
    const int jd = KEEP - 1 - k;
    d.put(jd & 1 ? w[2 + jd / 2] >> 16 : w[2 + jd / 2] & 0xffffu);
    if (k < A) a.put(k & 1 ? w[2 + k / 2] >> 16 : w[2 + k / 2] & 0xffffu);
  }
}

template <int KEEP, int KS, int DEPTH, int MB>
__device__ __forceinline__ void bal_gemv(const __half* __restrict__ X, const uint8_t* __restrict__ rec,
                                         __half* __restrict__ Y, int M, int K, int N) {
  using RC = Rec<KEEP>;
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int KT = K >> 3, steps = KT >> 4;  // a step: 16 k-tiles (128 input channels) of both strips = 32 records
  const int s0 = warp * steps / KS, s1 = (warp + 1) * steps / KS;
  const uint32_t tiles = smem_u32(smem + warp * 2 * 32 * kTileStride);  // two buffers of 32 tile slots
  float* red = reinterpret_cast<float*>(smem + KS * 2 * 32 * kTileStride);
  // X (B operand): lane = (row n = lane / 4 (+ 8 for the second n8 block), quarter j = lane % 4) loads columns
  // 128 i + 32 j .. + 31 of row n as four 16-byte loads: word 2 q + h = columns 32 j + 4 q + 2 h + {0, 1}, the B
  // pair of k16 step q, half h. The packer gives tile 2 q + h of a step exactly those columns (column 2 j + e of
  // the tile = 32 j + 4 q + 2 h + e).
  const int xn = lane >> 2, xj = lane & 3;
  const uint4* xrow[MB];
  bool xv[MB];
#pragma unroll
  for (int mb = 0; mb < MB; ++mb) {
    xv[mb] = xn + 8 * mb < M;
    xrow[mb] = reinterpret_cast<const uint4*>(X + static_cast<size_t>(xv[mb] ? xn + 8 * mb : 0) * K + 32 * xj);
  }
  const uint32_t lm = (lane >> 3) * kTileStride + 16 * (lane & 7);  // ldmatrix: slot 4 q + lane / 8, row lane % 8
  const int NP = N >> 4;
  for (int p = blockIdx.x; p < NP; p += gridDim.x) {  // strip pair: output channels 16 p .. 16 p + 15
    // this lane's record of step i: r = (p KT + 16 i) * 2 + lane -> group (p KT) / 8 + 2 i + lane / 16
    const uint8_t* rp = rec + static_cast<size_t>((p * KT) / 8 + (lane >> 4)) * 16 * RC::R + 8 * (lane & 15);
    auto load = [&](int i, uint32_t (&w)[RC::NW], uint32_t (&xb)[MB][16]) {
      const uint8_t* src = rp + static_cast<size_t>(i) * 32 * RC::R;
#pragma unroll
      for (int u = 0; u < RC::U; ++u) {
        const uint2 t = ldg_nc8(src + 128 * u);
        w[2 * u] = t.x;
        w[2 * u + 1] = t.y;
      }
#pragma unroll
      for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const uint4 v = xv[mb] ? xrow[mb][16 * i + c] : make_uint4(0u, 0u, 0u, 0u);
          xb[mb][4 * c] = v.x;
          xb[mb][4 * c + 1] = v.y;
          xb[mb][4 * c + 2] = v.z;
          xb[mb][4 * c + 3] = v.w;
        }
    };
    float acc[MB][2][4];  // per n8 block, even and odd k16 steps: two mma chains
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[mb][e >> 2][e & 3] = 0.f;
    auto step = [&](int i, const uint32_t (&w)[RC::NW], const uint32_t (&xb)[MB][16]) {
      const uint32_t buf = tiles + (i & 1) * 32 * kTileStride;
      decode_tile<KEEP>(w, buf + lane * kTileStride);
      __syncwarp();
#pragma unroll
      for (int q = 0; q < 8; ++q) {  // k16 step q: tiles 2q, 2q + 1 of both strips = slots 4q .. 4q + 3
#if BAL_ABL & 16
        asm volatile("" ::"r"(xb[0][2 * q]), "r"(xb[0][2 * q + 1]), "r"(buf) : "memory");
#else
        uint32_t a[4];
        ldsm_x4(a, buf + 4 * q * kTileStride + lm);
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) mma16816(acc[mb][q & 1], a, xb[mb][2 * q], xb[mb][2 * q + 1]);
#endif
      }
    };
    // records (and X) DEPTH - 1 steps ahead, in a ring of DEPTH register buffers (static names after unrolling)
    uint32_t w[DEPTH][RC::NW], xq[DEPTH][MB][16];
#pragma unroll
    for (int d = 0; d < DEPTH - 1; ++d)
      if (s0 + d < s1) load(s0 + d, w[d], xq[d]);
    for (int i = s0; i < s1; i += DEPTH) {
#pragma unroll
      for (int d = 0; d < DEPTH; ++d) {
        if (i + d < s1) {
          if (i + d + DEPTH - 1 < s1) load(i + d + DEPTH - 1, w[(d + DEPTH - 1) % DEPTH], xq[(d + DEPTH - 1) % DEPTH]);
          step(i + d, w[d], xq[d]);
        }
      }
    }
    // D: acc[mb][.][0..1] = rows lane / 4, X rows 8 mb + 2 (lane % 4) + {0, 1}; acc[mb][.][2..3] = rows lane / 4 + 8
    const int g = lane >> 2, c2 = 2 * (lane & 3);
    float* rw = red + warp * 256;  // [16 rows][16 X rows]
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) {
      rw[g * 16 + 8 * mb + c2] = acc[mb][0][0] + acc[mb][1][0];
      rw[g * 16 + 8 * mb + c2 + 1] = acc[mb][0][1] + acc[mb][1][1];
      rw[(g + 8) * 16 + 8 * mb + c2] = acc[mb][0][2] + acc[mb][1][2];
      rw[(g + 8) * 16 + 8 * mb + c2 + 1] = acc[mb][0][3] + acc[mb][1][3];
    }
    __syncthreads();
    for (int t = threadIdx.x; t < 16 * M; t += KS * 32) {
      const int row = t & 15, n = t >> 4;
      float s = 0.f;
#pragma unroll
      for (int k = 0; k < KS; ++k) s += red[k * 256 + row * 16 + n];
      Y[static_cast<size_t>(n) * N + 16 * p + row] = __float2half_rn(s);
    }
    __syncthreads();  // red is rewritten for the next pair
  }
}

}  // namespace

#define BAL(KEEP, KS, D, MB)                                                                                 \
  extern "C" __global__ void __launch_bounds__(KS * 32) bal_k##KEEP##_w##KS##_d##D##_m##MB(                    \
      const __half* __restrict__ X, const uint8_t* __restrict__ rec, __half* __restrict__ Y, int M, int K,      \
      int N) {                                                                                                  \
    bal_gemv<KEEP, KS, D, MB>(X, rec, Y, M, K, N);                                                              \
  }
#define BAL2(KEEP, KS, D) BAL(KEEP, KS, D, 1) BAL(KEEP, KS, D, 2)

BAL2(19, 4, 3)
BAL2(19, 8, 2)
BAL2(19, 8, 3)
BAL(19, 16, 2, 1)
BAL2(32, 4, 2)
BAL2(32, 8, 2)
BAL(32, 16, 2, 1)
BAL2(45, 4, 2)
BAL2(45, 8, 2)
BAL(45, 16, 2, 1)
