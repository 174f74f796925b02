// Exploration (session 36, issue 4): the balanced records of tools/bitmap_balanced.cu (every 8 x 8 tile keeps
// exactly KEEP of 64 weights; one record per tile, loaded into registers by one lane) decoded with no shared-memory
// bank conflicts at all. Round 14 (docs/bitmap_linear.md) found the scatter's bank conflicts to be that decode's
// limit: with each lane's stores in its own bank (a timing-only build) it ran 1.7x faster, at the memory's rate.
// This kernel makes that layout real (and measured it not faster than round 14's: docs/bitmap_linear.md, round 15):
//
// * Lane-owned banks. Lane L's tile (slot L) keeps its 32 words in bank L: word w at byte 128 w + 4 L of the warp's
//   4 KB buffer. The scatter's stores (one 16-bit store per kept value, RegDecode64's two bit walks) are then
//   conflict-free whatever the positions: each lane stays in its own bank.
// * XOR-diagonal reads. In read k (0..31), lane j = 4 g + q loads word j (row g, column pair q) of slot k ^ j: 32
//   distinct banks, conflict-free. The mma (m16n8k16, swap AB: W is the A operand) needs in each A register, from
//   lane (g, q), row g of one output row set and column pair q of one k-column set, the same for every g. That holds
//   when slot L = 4 a + b stands for strip a (8 output rows) and k-tile b (8 input channels) of a step of 8 strips x 4
//   k-tiles (64 output rows x 32 input channels): read k = 4 h + l gives lane (g, q) strip h ^ g, row g and k-tile
//   l ^ q, pair q. The packer puts k-tile b's column pair p on input channels 8 p + 2 (b ^ p) + {0, 1} of the step,
//   so that read k's lane (g, q) supplies channels 8 q + 2 l + {0, 1}: the B pair that lane (m, q) loads as word l
//   of one 16-byte load of X row m, channels 8 q .. 8 q + 7. A registers a0..a3 = reads (h1, l1), (h2, l1), (h1,
//   l2), (h2, l2) with h2 = h1 + 1, l2 = l1 + 1; accumulator h1 / 2 holds output rows 8 (h1 ^ g) + g and
//   8 (h2 ^ g) + g. Eight mma per step, as before.
// * Zero fill by 8 conflict-free 16-byte stores per lane (lane j: row (j >> 3) + 4 i, slots 4 (j & 7) ..), then
//   __syncwarp, since a lane zeroes other lanes' slots.
//
// Three walks (template WALK; kernel prefixes lb, lbh, lbp), each with its records and pruning constraint: see Rec
// and scatter(). Records of WALK 0: bitmap word 0 bit w <=> low half of tile word w (w = 4 r + p: row r, pair p), word
// 1 bit w <=> its high half; then the KEEP values in ascending bit order, fp16, zero-padded to a multiple of 4. Record r = (G S + s) 32 +
// L for row group G (64 output rows), step s (32 input channels, S = K / 32), slot L; stored chunk-major in groups of
// 16 records (unit u = bytes 8u..8u+7 of record r at byte (r / 16) 16 R + 128 u + 8 (r % 16)).
// Grid: (N / 64 row groups, KY k-chunks); KS warps of a block split the chunk's steps and are reduced in shared
// memory; with KY > 1 each block writes fp32 partials to P [KY, M, N] and the last block of a row group (a ticket in
// cnt[G], reset by that block) sums them in a fixed order into Y (deterministic).
// Limits of the prototype: fp16 X and values (scale 1, no bias), M <= 16, K % 32 == 0, N % 64 == 0.
// Ampere instructions only (ld.global.nc, st.shared, ld.shared, mma.sync, atom, fence.acq_rel).
#include <cuda_fp16.h>
#include <stdint.h>

namespace {

// Timing ablations (tools/bitmap_lanebank_explore.py --ablate; wrong results by design): bit 1 no zero fill; 2 no
// scatter stores (the walk's addresses and the values kept live); 4 no shared-memory reads (the A registers are the
// read addresses); 8 no record loads (a fixed 19-bit pattern and the lane's index as values); 16 no mma (the A
// registers kept live).
#ifndef LB_ABL
#define LB_ABL 0
#endif
// Occupancy variants (--ablate): LB_ONEBUF one 4 KB buffer per warp (a __syncwarp before each step's zero fill
// instead of alternating buffers), LB_MINB the blocks per SM asked of __launch_bounds__ (registers capped to fit).
// (The second __launch_bounds__ argument is given only when set: even a 1 there changes ptxas's register choice, 71 ->
// 91 for lb_k19_w8_d2_m1 on sm_90.)
#ifdef LB_MINB
#define LB_BOUNDS(T) __launch_bounds__(T, LB_MINB)
#else
#define LB_BOUNDS(T) __launch_bounds__(T)
#endif
#ifdef LB_ONEBUF
constexpr uint32_t kWarpBuf = 4096u, kStepOff = 0u;
#else
constexpr uint32_t kWarpBuf = 8192u, kStepOff = 4096u;
#endif

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ uint2 ldg_nc8(const void* p) {
  uint2 r;
  asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];\n" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}

__device__ __forceinline__ uint4 ldg_nc16(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

__device__ __forceinline__ void sts16(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(addr), "h"(static_cast<unsigned short>(v)) : "memory");
}

__device__ __forceinline__ void sts128_zero(uint32_t addr) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0u) : "memory");
}

__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One bit walk over a record's two bitmap words (the logic of AscWalk64 in plugins/sparse_kv/sparse_kv.cu; REV:
// bit-reversed words, i.e. from the top bit down). Bit c of a word is tile word c: byte 128 c from the word's base
// (base + 0 for the low halves, base + 2 for the high ones). The ascending walk keeps its base + 31 * 128 and
// subtracts 128 clz (bit c = 31 - clz of the isolated bit); the descending one adds 128 clz (clz of the isolated bit
// of the reversed word = c).
template <bool REV>
struct LaneWalk {
  uint32_t cur, nxt, rb, rnx;
  __device__ __forceinline__ void init(uint32_t first, uint32_t second, uint32_t r_first, uint32_t r_second) {
    cur = first != 0u ? first : second;
    rb = first != 0u ? r_first : r_second;
    nxt = second;
    rnx = r_second;
  }
  __device__ __forceinline__ void put(uint32_t v) {
    const uint32_t nc = cur & (cur - 1u);
    const uint32_t z7 = __clz(cur ^ nc) << 7;
#if LB_ABL & 2
    asm volatile("" ::"r"(REV ? rb + z7 : rb - z7), "r"(v));
#else
    sts16(REV ? rb + z7 : rb - z7, v);
#endif
    const bool z = nc == 0u;
    cur = z ? nxt : nc;
    rb = z ? rnx : rb;
  }
};

// One walk over a single 32-bit word with a fixed number of puts (WALK 1 and 2: no switch between words, so no
// selects): bit c at byte 128 c from the base; ascending (base + 31 * 128 - 128 clz) or, on the reversed word,
// descending (base + 128 clz). S32: 32-bit stores (a pair of values) instead of 16-bit ones.
template <bool REV, bool S32>
struct WordWalk {
  uint32_t cur, rb;
  __device__ __forceinline__ void put(uint32_t v) {
    const uint32_t nc = cur & (cur - 1u);
    const uint32_t z7 = __clz(cur ^ nc) << 7;
    const uint32_t addr = REV ? rb + z7 : rb - z7;
#if LB_ABL & 2
    asm volatile("" ::"r"(addr), "r"(v));
#else
    if (S32)
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
    else
      sts16(addr, v);
#endif
    cur = nc;
  }
};

// Records. WALK 0 and 1: an 8-byte bitmap (word 0 bit c <=> low half of tile word c, word 1 <=> high halves), then
// KEEP fp16 values in ascending bit order, zero-padded to a multiple of 4. WALK 1 adds a constraint on the pruning
// (not on the layout): word 0 has exactly (KEEP + 1) / 2 bits set, word 1 KEEP / 2. WALK 2 ("pairs"): a 4-byte
// bitmap (bit c <=> tile word c, both halves), then KEEP 32-bit words (value pairs), zero-padded to 8 bytes.
template <int KEEP, int WALK>
struct Rec {
  static constexpr int R = WALK == 2 ? (4 + 4 * KEEP + 7) / 8 * 8 : 8 + 2 * ((KEEP + 3) & ~3);  // bytes
  static constexpr int U = R / 8;   // 8-byte units
  static constexpr int NW = 2 * U;  // 32-bit words
};

// Scatter the lane's values into its slot (slot = buffer + 4 lane).
template <int KEEP, int WALK>
__device__ __forceinline__ void scatter(const uint32_t (&w)[Rec<KEEP, WALK>::NW], uint32_t slot) {
  if constexpr (WALK == 0) {  // two walks over both words (value j = half j % 2 of word 2 + j / 2)
    LaneWalk<false> a;
    LaneWalk<true> d;
    a.init(w[0], w[1], slot + 31u * 128u, slot + 2u + 31u * 128u);
    d.init(__brev(w[1]), __brev(w[0]), slot + 2u, slot);
    constexpr int A = KEEP / 2;  // values 0 .. A-1 ascending, KEEP-1 .. A descending
#pragma unroll
    for (int k = 0; k < KEEP - A; ++k) {
      const int jd = KEEP - 1 - k;
      d.put(jd & 1 ? w[2 + jd / 2] >> 16 : w[2 + jd / 2] & 0xffffu);
      if (k < A) a.put(k & 1 ? w[2 + k / 2] >> 16 : w[2 + k / 2] & 0xffffu);
    }
  } else if constexpr (WALK == 1) {  // one ascending walk per word: values 0 .. K0-1 (low halves), K0 .. (high)
    constexpr int K0 = (KEEP + 1) / 2;
    WordWalk<false, false> a{w[0], slot + 31u * 128u};
    WordWalk<false, false> b{w[1], slot + 2u + 31u * 128u};
#pragma unroll
    for (int k = 0; k < K0; ++k) {
      a.put(k & 1 ? w[2 + k / 2] >> 16 : w[2 + k / 2] & 0xffffu);
      const int jb = K0 + k;
      if (jb < KEEP) b.put(jb & 1 ? w[2 + jb / 2] >> 16 : w[2 + jb / 2] & 0xffffu);
    }
  } else {  // pairs: value word j = w[1 + j]; ascending takes 0 .. A-1, descending KEEP-1 .. A
    constexpr int A = KEEP / 2;
    WordWalk<false, true> a{w[0], slot + 31u * 128u};
    WordWalk<true, true> d{__brev(w[0]), slot};
#pragma unroll
    for (int k = 0; k < KEEP - A; ++k) {
      d.put(w[KEEP - k]);
      if (k < A) a.put(w[1 + k]);
    }
  }
}

// scatter() in rounds, for the spliced kernels (SPLICE): round k does what iteration k of scatter()'s loop does, so
// that the kernel can place the rounds of step s + 1 between the reads and mma of step s.
template <int KEEP, int WALK>
struct Scat {
  static constexpr int A = WALK == 1 ? (KEEP + 1) / 2 : KEEP / 2;
  static constexpr int ROUNDS = WALK == 1 ? (KEEP + 1) / 2 : KEEP - KEEP / 2;
  LaneWalk<false> a0;
  LaneWalk<true> d0;
  WordWalk<false, WALK == 2> a1;
  WordWalk<WALK == 2, WALK == 2> b1;  // WALK 1: ascending over word 1; WALK 2: descending
  __device__ __forceinline__ void init(const uint32_t (&w)[Rec<KEEP, WALK>::NW], uint32_t slot) {
    if constexpr (WALK == 0) {
      a0.init(w[0], w[1], slot + 31u * 128u, slot + 2u + 31u * 128u);
      d0.init(__brev(w[1]), __brev(w[0]), slot + 2u, slot);
    } else if constexpr (WALK == 1) {
      a1 = {w[0], slot + 31u * 128u};
      b1 = {w[1], slot + 2u + 31u * 128u};
    } else {
      a1 = {w[0], slot + 31u * 128u};
      b1 = {__brev(w[0]), slot};
    }
  }
  static __device__ __forceinline__ uint32_t half(const uint32_t (&w)[Rec<KEEP, WALK>::NW], int j) {
    return j & 1 ? w[2 + j / 2] >> 16 : w[2 + j / 2] & 0xffffu;
  }
  __device__ __forceinline__ void round(const uint32_t (&w)[Rec<KEEP, WALK>::NW], int k) {
    if constexpr (WALK == 0) {
      d0.put(half(w, KEEP - 1 - k));
      if (k < A) a0.put(half(w, k));
    } else if constexpr (WALK == 1) {
      a1.put(half(w, k));
      if (A + k < KEEP) b1.put(half(w, A + k));
    } else {
      b1.put(w[KEEP - k]);
      if (k < A) a1.put(w[1 + k]);
    }
  }
};

template <int KEEP, int KS, int DEPTH, int MB, int WALK, bool SPLICE = false>
__device__ __forceinline__ void lb_gemv(const __half* __restrict__ X, const uint8_t* __restrict__ rec,
                                        __half* __restrict__ Y, float* __restrict__ P, unsigned* __restrict__ cnt,
                                        int M, int K, int N) {
  using RC = Rec<KEEP, WALK>;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int last;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int S = K >> 5, G = blockIdx.x, KY = gridDim.y, ky = blockIdx.y;
  const int b0 = ky * S / KY, b1 = (ky + 1) * S / KY;
  const int s0 = b0 + warp * (b1 - b0) / KS, s1 = b0 + (warp + 1) * (b1 - b0) / KS;
  const uint32_t base = (smem_u32(smem) + 127u) & ~127u;  // 128-aligned: the reads' XOR stays in bits 2..6
  const uint32_t wbuf = base + warp * kWarpBuf;            // two 4 KB buffers (steps alternate)
  const uint32_t slot0 = wbuf + 4u * lane;                 // this lane's slot in buffer 0
  const uint32_t zero0 = wbuf + 128u * (lane >> 3) + 16u * (lane & 7);
  const uint32_t rd0 = wbuf + 128u * lane + 4u * lane;     // read k: rd ^ (4 k) = word lane of slot k ^ lane
  const int g = lane >> 2, q = lane & 3;
  const uint4* xrow[MB];
  bool xv[MB];
#pragma unroll
  for (int mb = 0; mb < MB; ++mb) {
    xv[mb] = g + 8 * mb < M;
    xrow[mb] = reinterpret_cast<const uint4*>(X + static_cast<size_t>(xv[mb] ? g + 8 * mb : 0) * K + 8 * q);
  }
  const uint8_t* rp = rec + static_cast<size_t>(G * S * 2 + (lane >> 4)) * 16 * RC::R + 8 * (lane & 15);
  auto load = [&](int s, uint32_t (&w)[RC::NW], uint32_t (&xb)[MB][4]) {
    const uint8_t* src = rp + static_cast<size_t>(s) * 32 * RC::R;
#if LB_ABL & 8
    w[0] = 0x01234567u ^ (lane << 3);
    w[1] = 0x00300000u | (lane & 3u);
#pragma unroll
    for (int u = 2; u < RC::NW; ++u) w[u] = lane * u;
    asm volatile("" ::"l"(src));
#else
#pragma unroll
    for (int u = 0; u < RC::U; ++u) {
      const uint2 t = ldg_nc8(src + 128 * u);
      w[2 * u] = t.x;
      w[2 * u + 1] = t.y;
    }
#endif
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) {
      const uint4 v = xv[mb] ? ldg_nc16(xrow[mb] + 4 * s) : make_uint4(0u, 0u, 0u, 0u);
      xb[mb][0] = v.x;
      xb[mb][1] = v.y;
      xb[mb][2] = v.z;
      xb[mb][3] = v.w;
    }
  };
  float acc[MB][4][4];
#pragma unroll
  for (int mb = 0; mb < MB; ++mb)
#pragma unroll
    for (int e = 0; e < 16; ++e) acc[mb][e >> 2][e & 3] = 0.f;
  auto step = [&](int s, const uint32_t (&w)[RC::NW], const uint32_t (&xb)[MB][4]) {
    const uint32_t off = (s & 1) * kStepOff;
#ifdef LB_ONEBUF
    __syncwarp();  // every lane's reads of the previous step are done
#endif
#if !(LB_ABL & 1)
#pragma unroll
    for (int i = 0; i < 8; ++i) sts128_zero(zero0 + off + 512u * i);
#endif
    __syncwarp();
    scatter<KEEP, WALK>(w, slot0 + off);
    __syncwarp();
    const uint32_t rd = rd0 + off;
#pragma unroll
    for (int hp = 0; hp < 4; ++hp)
#pragma unroll
      for (int lp = 0; lp < 2; ++lp) {
        const uint32_t h1 = 2 * hp, h2 = h1 + 1, l1 = 2 * lp, l2 = l1 + 1;
        uint32_t a[4];
#if LB_ABL & 4
        a[0] = rd ^ (4u * (4u * h1 + l1));
        a[1] = rd ^ (4u * (4u * h2 + l1));
        a[2] = rd ^ (4u * (4u * h1 + l2));
        a[3] = rd ^ (4u * (4u * h2 + l2));
#else
        a[0] = lds32(rd ^ (4u * (4u * h1 + l1)));
        a[1] = lds32(rd ^ (4u * (4u * h2 + l1)));
        a[2] = lds32(rd ^ (4u * (4u * h1 + l2)));
        a[3] = lds32(rd ^ (4u * (4u * h2 + l2)));
#endif
#if LB_ABL & 16
        asm volatile("" ::"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(xb[0][l1]), "r"(xb[0][l2]));
#else
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) mma16816(acc[mb][hp], a, xb[mb][l1], xb[mb][l2]);
#endif
      }
  };
  // records (and X) DEPTH - 1 steps ahead, in a ring of DEPTH register buffers (static names after unrolling)
  uint32_t w[DEPTH][RC::NW], xq[DEPTH][MB][4];
#pragma unroll
  for (int d = 0; d < DEPTH - 1; ++d)
    if (s0 + d < s1) load(s0 + d, w[d], xq[d]);
  if constexpr (!SPLICE) {
    for (int i = s0; i < s1; i += DEPTH) {
#pragma unroll
      for (int d = 0; d < DEPTH; ++d) {
        if (i + d < s1) {
          if (i + d + DEPTH - 1 < s1) load(i + d + DEPTH - 1, w[(d + DEPTH - 1) % DEPTH], xq[(d + DEPTH - 1) % DEPTH]);
          step(i + d, w[d], xq[d]);
        }
      }
    }
  } else {
    // Spliced: step s + 1's zero fill and scatter (into the other buffer) run during step s's reads and mma, a few
    // walk rounds after each group of 4 reads + mma. Step s0's scatter runs alone first.
    static_assert(kStepOff != 0u, "the splice needs two buffers per warp");
    if (s0 < s1) {
      const uint32_t off = (s0 & 1) * kStepOff;
#pragma unroll
      for (int i = 0; i < 8; ++i) sts128_zero(zero0 + off + 512u * i);
      __syncwarp();
      scatter<KEEP, WALK>(w[0], slot0 + off);
      __syncwarp();
    }
    using SC = Scat<KEEP, WALK>;
    for (int i = s0; i < s1; i += DEPTH) {
#pragma unroll
      for (int d = 0; d < DEPTH; ++d) {
        const int s = i + d;
        if (s < s1) {
          if (s + DEPTH - 1 < s1) load(s + DEPTH - 1, w[(d + DEPTH - 1) % DEPTH], xq[(d + DEPTH - 1) % DEPTH]);
          const bool nxt = s + 1 < s1;  // warp-uniform
          const uint32_t offn = ((s + 1) & 1) * kStepOff, rd = rd0 + (s & 1) * kStepOff;
          if (nxt) {
#pragma unroll
            for (int z = 0; z < 8; ++z) sts128_zero(zero0 + offn + 512u * z);
          }
          __syncwarp();  // the zero fill (other lanes' slots) before this lane's scatter
          SC sc;
          if (nxt) sc.init(w[(d + 1) % DEPTH], slot0 + offn);
#pragma unroll
          for (int gi = 0; gi < 8; ++gi) {
            const uint32_t hp = gi >> 1, h1 = 2 * hp, h2 = h1 + 1, l1 = 2 * (gi & 1), l2 = l1 + 1;
            uint32_t a[4];
            a[0] = lds32(rd ^ (4u * (4u * h1 + l1)));
            a[1] = lds32(rd ^ (4u * (4u * h2 + l1)));
            a[2] = lds32(rd ^ (4u * (4u * h1 + l2)));
            a[3] = lds32(rd ^ (4u * (4u * h2 + l2)));
#pragma unroll
            for (int mb = 0; mb < MB; ++mb) mma16816(acc[mb][hp], a, xq[d][mb][l1], xq[d][mb][l2]);
            if (nxt) {
#pragma unroll
              for (int k = gi * SC::ROUNDS / 8; k < (gi + 1) * SC::ROUNDS / 8; ++k) sc.round(w[(d + 1) % DEPTH], k);
            }
          }
          __syncwarp();  // step s + 1's scatter is visible, and step s's reads are done before its buffer is zeroed
        }
      }
    }
  }
  // D of accumulator hp: [0..1] = output row 8 (2 hp ^ g) + g, [2..3] = row 8 ((2 hp + 1) ^ g) + g; X rows 8 mb +
  // 2 q + {0, 1}. Into this warp's own buffer, [64 rows][16 X rows] fp32.
  float* red = reinterpret_cast<float*>(smem + (base - smem_u32(smem)));
  float* rw = red + warp * (kWarpBuf / 4);
  __syncwarp();  // every lane's last reads of buffer 0 are done (added after the session-36 runs; outside the loop)
#pragma unroll
  for (int mb = 0; mb < MB; ++mb)
#pragma unroll
    for (int hp = 0; hp < 4; ++hp) {
      const int r0 = 8 * ((2 * hp) ^ g) + g, r1 = 8 * ((2 * hp + 1) ^ g) + g, c = 8 * mb + 2 * q;
      rw[r0 * 16 + c] = acc[mb][hp][0];
      rw[r0 * 16 + c + 1] = acc[mb][hp][1];
      rw[r1 * 16 + c] = acc[mb][hp][2];
      rw[r1 * 16 + c + 1] = acc[mb][hp][3];
    }
  __syncthreads();
  for (int t = threadIdx.x; t < 64 * M; t += KS * 32) {
    const int row = t & 63, m = t >> 6;
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < KS; ++k) s += red[k * (kWarpBuf / 4) + row * 16 + m];
    if (KY == 1)
      Y[static_cast<size_t>(m) * N + 64 * G + row] = __float2half_rn(s);
    else
      P[(static_cast<size_t>(ky) * M + m) * N + 64 * G + row] = s;
  }
  if (KY == 1) return;
  __syncthreads();  // the block's partials are written (CTA scope); thread 0's release fence makes them GPU-visible
  if (threadIdx.x == 0) {
    asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
    const bool l = atomicAdd(cnt + G, 1u) == static_cast<unsigned>(KY - 1);
    if (l) asm volatile("fence.acq_rel.gpu;\n" ::: "memory");  // acquire the other blocks' partials
    last = l;
  }
  __syncthreads();
  if (!last) return;
  for (int t = threadIdx.x; t < 64 * M; t += KS * 32) {
    const int row = t & 63, m = t >> 6;
    float s = 0.f;
    for (int k = 0; k < KY; ++k) s += __ldcg(P + (static_cast<size_t>(k) * M + m) * N + 64 * G + row);
    Y[static_cast<size_t>(m) * N + 64 * G + row] = __float2half_rn(s);
  }
  if (threadIdx.x == 0) cnt[G] = 0u;  // ready for the next launch
}

}  // namespace

#define LBW(PFX, WALK, KEEP, KS, D, MB)                                                                      \
  extern "C" __global__ void LB_BOUNDS(KS * 32) PFX##_k##KEEP##_w##KS##_d##D##_m##MB(          \
      const __half* __restrict__ X, const uint8_t* __restrict__ rec, __half* __restrict__ Y,                    \
      float* __restrict__ P, unsigned* __restrict__ cnt, int M, int K, int N) {                                 \
    lb_gemv<KEEP, KS, D, MB, WALK>(X, rec, Y, P, cnt, M, K, N);                                                 \
  }
#define LBS(PFX, WALK, KEEP, KS, D, MB)                                                                      \
  extern "C" __global__ void LB_BOUNDS(KS * 32) PFX##_k##KEEP##_w##KS##_d##D##_m##MB(                           \
      const __half* __restrict__ X, const uint8_t* __restrict__ rec, __half* __restrict__ Y,                    \
      float* __restrict__ P, unsigned* __restrict__ cnt, int M, int K, int N) {                                 \
    lb_gemv<KEEP, KS, D, MB, WALK, true>(X, rec, Y, P, cnt, M, K, N);                                           \
  }
#define LB2(KEEP, KS, D) LBW(lb, 0, KEEP, KS, D, 1) LBW(lb, 0, KEEP, KS, D, 2)
#define LBH2(KEEP, KS, D) LBW(lbh, 1, KEEP, KS, D, 1) LBW(lbh, 1, KEEP, KS, D, 2)
#define LBP2(KEEP, KS, D) LBW(lbp, 2, KEEP, KS, D, 1) LBW(lbp, 2, KEEP, KS, D, 2)

// WALK 0: any balanced tile
LB2(19, 4, 3)
LB2(19, 8, 2)
LB2(19, 8, 3)
LB2(19, 16, 2)
LB2(32, 4, 2)
LB2(32, 8, 2)
LB2(32, 16, 2)
LB2(45, 4, 2)
LB2(45, 8, 2)
LB2(45, 16, 2)
// WALK 1: balanced per half (even / odd channels of the tile)
LBH2(19, 4, 3)
LBH2(19, 8, 2)
LBH2(19, 16, 2)
LBH2(32, 4, 2)
LBH2(32, 8, 2)
LBH2(32, 16, 2)
// WALK 2: pairs of adjacent channels kept or pruned together (10 / 16 of 32 pairs: 68.75 / 50 % sparsity)
LBP2(10, 4, 3)
LBP2(10, 8, 2)
LBP2(10, 16, 2)
LBP2(16, 4, 2)
LBP2(16, 8, 2)
LBP2(16, 16, 2)
// Spliced (step s + 1's zero fill and walk between step s's reads and mma), element walk and pairs, 70 %
#ifndef LB_ONEBUF
LBS(lbs, 0, 19, 4, 3, 1) LBS(lbs, 0, 19, 4, 3, 2)
LBS(lbs, 0, 19, 8, 2, 1) LBS(lbs, 0, 19, 8, 2, 2)
LBS(lbs, 0, 19, 8, 3, 1) LBS(lbs, 0, 19, 8, 3, 2)
LBS(lbps, 2, 10, 4, 3, 1) LBS(lbps, 2, 10, 4, 3, 2)
LBS(lbps, 2, 10, 8, 2, 1) LBS(lbps, 2, 10, 8, 2, 2)
LBS(lbps, 2, 10, 8, 3, 1) LBS(lbps, 2, 10, 8, 3, 2)
#endif
