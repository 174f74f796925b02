// EdgeBitmapLinear: Y[M, N] = X[M, K] · Wᵀ · diag(scales) + bias, W in the bitmap format of
// edgesdk/formats/bitmap_linear.py (8-row strips, 64-column groups of eight 8×8 tiles, one uint64
// bitmap per tile, packed fp16 or int8 values, int32 group offsets, 16-byte-aligned groups).
//
// "Load as compressed, compute as dense": each warp owns one strip (8 output channels) and a
// contiguous range of its groups. It streams the compressed bytes of those groups (bitmaps + values,
// one contiguous 16-byte-aligned range) into a private shared-memory ring with cp.async (STAGES
// groups in flight), then decodes every 8×8 tile straight into an mma.sync.m16n8k16 B fragment:
// lane l holds tile bits 2l and 2l+1, whose values sit at popcount(bitmap & ((1<<2l)-1)) after the
// tile's start. X (A operand, M rows) is read from global memory (L1/L2 resident) per fragment with
// bounds checks, so M is never padded in memory; MT m16 blocks per warp reuse one decoded B fragment.
// Accumulation is fp32 on tensor cores; fp32 X is split into hi + lo fp16 halves (two mma).
// Warps of a block that share a strip split K and are reduced through shared memory at the end.
//
// Ampere instructions only (mma.sync, cp.async, popc); compiled for sm_87 and sm_90.
// Launch: grid (ceil(S / SPB), ceil(M / (16·MT))), block 32·SPB·KS threads (warp w: strip
// blockIdx.x·SPB + w / KS, K split w % KS), dynamic smem = bitmap_linear_smem_bytes(...).
#include <cuda_fp16.h>

#include "common/ampere.cuh"

namespace {

constexpr int kGroupK = 64;
constexpr int kTiles = 8;

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src));
}

__device__ __forceinline__ uint32_t pack_half2(__half lo, __half hi) {
  return static_cast<uint32_t>(__half_as_ushort(lo)) | (static_cast<uint32_t>(__half_as_ushort(hi)) << 16);
}

// Stored value → fp16 (int8 values are exact in fp16).
__device__ __forceinline__ __half to_half(__half v) { return v; }
__device__ __forceinline__ __half to_half(int8_t v) { return __short2half_rn(static_cast<short>(v)); }

// X[m, k], X[m, k+1] as fp16 pairs (hi part, and lo part for fp32 X); zero outside [M, K].
// k is even; when K is even every pair is aligned and in bounds.
struct XPair { uint32_t hi, lo; };

__device__ __forceinline__ XPair load_x(const __half* __restrict__ X, int M, int K, bool k_even, int m, int k) {
  XPair r{0u, 0u};
  if (m < M && k < K) {
    const __half* p = X + static_cast<size_t>(m) * K + k;
    if (k_even) {
      r.hi = __ldg(reinterpret_cast<const unsigned int*>(p));
    } else {
      __half a = p[0];
      __half b = (k + 1 < K) ? p[1] : __ushort_as_half(0);
      r.hi = pack_half2(a, b);
    }
  }
  return r;
}

__device__ __forceinline__ XPair load_x(const float* __restrict__ X, int M, int K, bool k_even, int m, int k) {
  XPair r{0u, 0u};
  if (m < M && k < K) {
    const float* p = X + static_cast<size_t>(m) * K + k;
    float a, b;
    if (k_even) {
      float2 v = __ldg(reinterpret_cast<const float2*>(p));
      a = v.x; b = v.y;
    } else {
      a = p[0];
      b = (k + 1 < K) ? p[1] : 0.f;
    }
    __half ah = __float2half_rn(a), bh = __float2half_rn(b);
    r.hi = pack_half2(ah, bh);
    r.lo = pack_half2(__float2half_rn(a - __half2float(ah)), __float2half_rn(b - __half2float(bh)));
  }
  return r;
}

__device__ __forceinline__ void store_y(__half* Y, size_t i, float v) { Y[i] = __float2half_rn(v); }
__device__ __forceinline__ void store_y(float* Y, size_t i, float v) { Y[i] = v; }

// One 8×8 tile → this lane's two B-fragment values (bits 2·lane, 2·lane+1) as a half2.
template <typename VT>
__device__ __forceinline__ uint32_t decode_tile(uint64_t bm, const VT* vals, int lane) {
  const int sh = 2 * lane;
  const uint32_t two = static_cast<uint32_t>(bm >> sh) & 3u;
  const int idx = __popcll(bm & ((1ull << sh) - 1ull));
  __half v0 = __ushort_as_half(0), v1 = __ushort_as_half(0);
  if (two & 1u) v0 = to_half(vals[idx]);
  if (two & 2u) v1 = to_half(vals[idx + (two & 1u)]);
  return pack_half2(v0, v1);
}

template <typename VT>
__host__ __device__ constexpr int slot_bytes() {
  return kTiles * 8 + kGroupK * 8 * static_cast<int>(sizeof(VT));
}

template <typename XT, typename VT, int MT, int STAGES>
__device__ __forceinline__ void bitmap_linear_body(
    const XT* __restrict__ X, const uint8_t* __restrict__ bitmaps, const VT* __restrict__ values,
    const int* __restrict__ offsets, const float* __restrict__ scales, const float* __restrict__ bias,
    XT* __restrict__ Y, int M, int N, int K, int KS, int SPB) {
  constexpr bool kSplitX = sizeof(XT) == 4;
  constexpr int kSlot = slot_bytes<VT>();
  extern __shared__ __align__(16) uint8_t smem[];

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int S = (N + 7) >> 3;
  const int G = (K + kGroupK - 1) / kGroupK;
  const int strip = blockIdx.x * SPB + warp / KS;
  const int ks = warp % KS;
  const bool active = strip < S;
  const int g0 = static_cast<int>((static_cast<long long>(G) * ks) / KS);
  const int g1 = static_cast<int>((static_cast<long long>(G) * (ks + 1)) / KS);
  const int ng = active ? g1 - g0 : 0;
  const int mbase = blockIdx.y * (16 * MT);
  // Paired loads of X need an even K and an X aligned to one pair.
  const bool k_even = (K & 1) == 0 && (reinterpret_cast<uintptr_t>(X) & (2 * sizeof(XT) - 1)) == 0;
  const int gid = lane >> 2, t4 = lane & 3;

  uint8_t* ring = smem + static_cast<size_t>(warp) * STAGES * kSlot;
  const size_t gbase = static_cast<size_t>(strip) * G + g0;  // first global group index of this warp
  const size_t ngroups_total = static_cast<size_t>(S) * G;

  // Offsets window: lane j holds offsets[gbase + wbase + j]; refreshed every 31 groups.
  int wbase = 0;
  int win = 0;
  auto load_win = [&](int base) {
    wbase = base;
    const size_t i = gbase + base + lane;
    win = (active && i <= ngroups_total) ? __ldg(offsets + i) : 0;
  };
  load_win(0);

  auto issue = [&](int j) {  // cp.async group j of this warp into slot j % STAGES (warp-uniform j)
    if (j < ng) {
      if (j - wbase >= 31) load_win(j);
      const int start = __shfl_sync(0xffffffffu, win, j - wbase);
      const int end = __shfl_sync(0xffffffffu, win, j - wbase + 1);
      const int nchunks = 4 + ((end - start) * static_cast<int>(sizeof(VT))) / 16;
      uint8_t* slot = ring + (j % STAGES) * kSlot;
      const uint8_t* bsrc = bitmaps + (gbase + j) * (kTiles * 8);
      const uint8_t* vsrc = reinterpret_cast<const uint8_t*>(values + start);
      for (int c = lane; c < nchunks; c += 32)
        cp_async16(slot + 16 * c, c < 4 ? bsrc + 16 * c : vsrc + 16 * (c - 4));
    }
    cp_async_commit();
  };

  float acc[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[mt][r] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) issue(s);

  for (int i = 0; i < ng; ++i) {
    issue(i + STAGES - 1);
    cp_async_wait<STAGES - 1>();
    __syncwarp();
    const uint8_t* slot = ring + (i % STAGES) * kSlot;
    uint64_t bm[kTiles];
#pragma unroll
    for (int t = 0; t < kTiles; t += 2) {
      const uint4 v = *reinterpret_cast<const uint4*>(slot + 8 * t);
      bm[t] = (static_cast<uint64_t>(v.y) << 32) | v.x;
      bm[t + 1] = (static_cast<uint64_t>(v.w) << 32) | v.z;
    }
    const VT* vals = reinterpret_cast<const VT*>(slot + kTiles * 8);
    const int kg = (g0 + i) * kGroupK;
    int voff = 0;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t m0 = bm[2 * kk], m1 = bm[2 * kk + 1];
      const uint32_t b0 = decode_tile<VT>(m0, vals + voff, lane);
      voff += __popcll(m0);
      const uint32_t b1 = decode_tile<VT>(m1, vals + voff, lane);
      voff += __popcll(m1);
      const int k = kg + kk * 16 + 2 * t4;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int m = mbase + mt * 16 + gid;
        if (mbase + mt * 16 >= M) break;  // warp-uniform
        const XPair x0 = load_x(X, M, K, k_even, m, k);
        const XPair x1 = load_x(X, M, K, k_even, m + 8, k);
        const XPair x2 = load_x(X, M, K, k_even, m, k + 8);
        const XPair x3 = load_x(X, M, K, k_even, m + 8, k + 8);
        const uint32_t ahi[4] = {x0.hi, x1.hi, x2.hi, x3.hi};
        mma16816(acc[mt], ahi, b0, b1);
        if (kSplitX) {
          const uint32_t alo[4] = {x0.lo, x1.lo, x2.lo, x3.lo};
          mma16816(acc[mt], alo, b0, b1);
        }
      }
    }
    __syncwarp();
  }
  cp_async_wait<0>();

  // Reduce the KS K-splits of each strip through shared memory (reusing the ring).
  float* red = reinterpret_cast<float*>(smem);
  if (KS > 1) {
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int r = 0; r < 4; ++r) red[((warp * MT + mt) * 4 + r) * 32 + lane] = acc[mt][r];
    __syncthreads();
    if (ks != 0) return;
    for (int o = 1; o < KS; ++o)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[mt][r] += red[(((warp + o) * MT + mt) * 4 + r) * 32 + lane];
  }
  if (!active) return;
  const int n0 = strip * 8 + 2 * t4;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int n = n0 + j;
    if (n >= N) continue;
    const float sc = scales[n];
    const float bi = bias ? bias[n] : 0.f;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int m = mbase + mt * 16 + gid;
      if (m < M) store_y(Y, static_cast<size_t>(m) * N + n, acc[mt][j] * sc + bi);
      if (m + 8 < M) store_y(Y, static_cast<size_t>(m + 8) * N + n, acc[mt][2 + j] * sc + bi);
    }
  }
}


// ---------------------------------------------------------------------------------------------
// Decode path (fp16 X, M <= 16, K % 8 == 0): X is staged through the same cp.async ring as the
// weights (zero-filled past K), read with ldmatrix (XOR-swizzled 16-byte chunks, no bank
// conflicts), rows >= M masked in registers. One warp decodes SPW strips per group and reuses each
// A fragment SPW times, cutting X traffic by SPW. Decode uses 32-bit words of the tile bitmap.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void cp_async16_zfill(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async16_s(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async16_zfill_s(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

// Lane constants for decoding one 8×8 tile given as two 32-bit words.
struct LaneBits {
  bool hi;         // this lane's bits live in the high word (lanes 16..31)
  uint32_t sh;     // bit position of the lane's first bit inside its word
  uint32_t below;  // mask of the word's bits below the lane's
};

// Branch-free: both values are always loaded (an index past the group's values lands in the slot's
// 16-byte slack, so stays in shared memory) and zeroed by select when their bit is clear.
__device__ __forceinline__ uint32_t decode_half(uint32_t lo, uint32_t hi, uint32_t plo, const LaneBits& lb,
                                                const unsigned short* vals, int voff) {
  const uint32_t w = lb.hi ? hi : lo;
  const int idx = voff + (lb.hi ? static_cast<int>(plo) : 0) + __popc(w & lb.below);
  const uint32_t two = (w >> lb.sh) & 3u;
  const uint32_t v0 = vals[idx];  // idx <= 512 (< 512 when the bit is set): inside the slack
  const uint32_t v1 = vals[idx + static_cast<int>(two & 1u)];
  return ((two & 1u) ? v0 : 0u) | ((two & 2u) ? (v1 << 16) : 0u);
}

__device__ __forceinline__ uint32_t decode_half(uint32_t lo, uint32_t hi, uint32_t plo, const LaneBits& lb,
                                                const uint8_t* vals, int voff) {
  // int8 v -> fp16 exactly: bits 0x6400 + (v + 128) is 1024 + v + 128; subtract 1152 per half.
  const uint32_t w = lb.hi ? hi : lo;
  const int idx = voff + (lb.hi ? static_cast<int>(plo) : 0) + __popc(w & lb.below);
  const uint32_t two = (w >> lb.sh) & 3u;
  const uint32_t u0 = (two & 1u) ? (vals[idx] ^ 0x80u) : 0x80u;  // idx <= 512: inside the slack
  const uint32_t u1 = (two & 2u) ? (vals[idx + static_cast<int>(two & 1u)] ^ 0x80u) : 0x80u;
  const uint32_t bits = (u0 | (u1 << 16)) + 0x64006400u;
  const __half2 h = __hsub2(*reinterpret_cast<const __half2*>(&bits), __halves2half2(__ushort_as_half(0x6480),
                                                                                      __ushort_as_half(0x6480)));
  return *reinterpret_cast<const uint32_t*>(&h);
}

template <typename VT> struct RawV { using T = unsigned short; };
template <> struct RawV<int8_t> { using T = uint8_t; };

template <typename VT, int SPW, int STAGES>
__device__ __forceinline__ void bitmap_gemv_body(
    const __half* __restrict__ X, const uint8_t* __restrict__ bitmaps, const VT* __restrict__ values,
    const int* __restrict__ offsets, const float* __restrict__ scales, const float* __restrict__ bias,
    __half* __restrict__ Y, int M, int N, int K, int KS, int SPB) {
  using RV = typename RawV<VT>::T;
  constexpr int kW = slot_bytes<VT>() + 16;  // one strip's bitmaps + values + 16 bytes of slack
  constexpr int kVChunks = (kGroupK * 8 * static_cast<int>(sizeof(VT))) / 16;  // max value chunks per group
  extern __shared__ __align__(16) uint8_t smem[];

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int S = (N + 7) >> 3;
  const int G = (K + kGroupK - 1) / kGroupK;
  const int sb = blockIdx.x * SPB + warp / KS;  // strip block: strips sb*SPW .. sb*SPW + SPW - 1
  const int ks = warp % KS;
  const int strip0 = sb * SPW;
  const bool active = strip0 < S;
  const int g0 = static_cast<int>((static_cast<long long>(G) * ks) / KS);
  const int g1 = static_cast<int>((static_cast<long long>(G) * (ks + 1)) / KS);
  const int ng = active ? g1 - g0 : 0;
  const int gid = lane >> 2;
  // Slot: X rows (8 or 16 rows of 128 bytes; rows >= M hold stale data and are masked after
  // ldmatrix) then SPW strips' bitmaps + values.
  const int xbytes = (M > 8 ? 16 : 8) * 128;
  const int kSlot = xbytes + SPW * kW;

  uint8_t* ring = smem + static_cast<size_t>(warp) * STAGES * kSlot;

  // Offsets of the next group to issue: lane s (< SPW) holds its start, lane 16 + s its end.
  const int os = lane & 15;
  const bool ovalid = os < SPW && strip0 + os < S;
  const int* optr = offsets + (static_cast<size_t>(strip0 + os) * G + g0 + (lane >> 4));
  int pre = (ovalid && ng > 0) ? __ldg(optr) : 0;
  const uint8_t* bsrc0 = bitmaps + (static_cast<size_t>(strip0) * G + g0) * (kTiles * 8) + 16 * (lane & 3);
  const size_t bstride = static_cast<size_t>(G) * (kTiles * 8);
  // This lane's X chunks: c = lane + 32 r -> row c / 8, 16-byte chunk c % 8 (swizzled in smem).
  const __half* xsrc = X + static_cast<size_t>(lane >> 3) * K + 8 * (lane & 7);

  auto issue = [&](int j) {
    if (j < ng) {
      const int cur = pre;
      if (j + 1 < ng) pre = ovalid ? __ldg(optr + j + 1) : 0;  // prefetch for the next issue
      uint8_t* slot = ring + (j % STAGES) * kSlot;
      const int kq = (g0 + j) * kGroupK + 8 * (lane & 7);
      const bool kok = kq < K;
#pragma unroll
      for (int r = 0; r < 4; ++r) {  // rows lane/8 + 4r
        const int row = (lane >> 3) + 4 * r;
        if (lane + 32 * r < M * 8)
          cp_async16_zfill(slot + row * 128 + (((lane & 7) ^ (row & 7)) << 4),
                           kok ? xsrc + static_cast<size_t>(4 * r) * K + (kq - 8 * (lane & 7)) : X, kok);
      }
#pragma unroll
      for (int s = 0; s < SPW; ++s) {
        const int start = __shfl_sync(0xffffffffu, cur, s);
        const int end = __shfl_sync(0xffffffffu, cur, 16 + s);
        if (strip0 + s >= S) break;  // warp-uniform
        uint8_t* dst = slot + xbytes + s * kW;
        if (lane < 4) cp_async16(dst + 16 * lane, bsrc0 + s * bstride + j * (kTiles * 8));
        const int nv = ((end - start) * static_cast<int>(sizeof(VT))) >> 4;
        const uint8_t* vsrc = reinterpret_cast<const uint8_t*>(values + start) + 16 * lane;
#pragma unroll
        for (int r = 0; r < (kVChunks + 31) / 32; ++r)
          if (lane + 32 * r < nv) cp_async16(dst + kTiles * 8 + 16 * (lane + 32 * r), vsrc + 512 * r);
      }
    }
    cp_async_commit();
  };

  LaneBits lb;
  lb.hi = lane >= 16;
  lb.sh = 2u * static_cast<uint32_t>(lane & 15);
  lb.below = (1u << lb.sh) - 1u;
  const uint32_t mask0 = gid < M ? 0xffffffffu : 0u;      // A rows gid
  const uint32_t mask1 = gid + 8 < M ? 0xffffffffu : 0u;  // A rows gid + 8
  // ldmatrix.x4 row address of this lane: matrix q = lane / 8 -> (rows +8 if q odd, k chunk +1 if q >= 2).
  // With an 8-row X area (M <= 8) matrices 1 and 3 re-read rows 0..7 (masked to 0 below), so every
  // address stays inside the slot.
  const int lrow = (lane & 7) + (M > 8 ? ((lane >> 3) & 1) * 8 : 0);
  const int lchunk = lane >> 4;

  float acc[SPW][4];
#pragma unroll
  for (int s = 0; s < SPW; ++s)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[s][r] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) issue(s);

  for (int i = 0; i < ng; ++i) {
    issue(i + STAGES - 1);
    cp_async_wait<STAGES - 1>();
    __syncwarp();
    const uint8_t* slot = ring + (i % STAGES) * kSlot;
    const uint32_t xbase = smem_u32(slot) + lrow * 128;
    int voff[SPW];
#pragma unroll
    for (int s = 0; s < SPW; ++s) voff[s] = 0;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, xbase + (((2 * kk + lchunk) ^ (lrow & 7)) << 4));
      a[0] &= mask0; a[2] &= mask0; a[1] &= mask1; a[3] &= mask1;
#pragma unroll
      for (int s = 0; s < SPW; ++s) {
        if (strip0 + s >= S) break;  // warp-uniform: padding strips of the last strip block
        const uint8_t* ws = slot + xbytes + s * kW;
        const uint4 bmv = *reinterpret_cast<const uint4*>(ws + 16 * kk);  // tiles 2kk, 2kk+1
        const RV* vals = reinterpret_cast<const RV*>(ws + kTiles * 8);
        const uint32_t p0 = __popc(bmv.x), p1 = __popc(bmv.z);
        const uint32_t b0 = decode_half(bmv.x, bmv.y, p0, lb, vals, voff[s]);
        voff[s] += p0 + __popc(bmv.y);
        const uint32_t b1 = decode_half(bmv.z, bmv.w, p1, lb, vals, voff[s]);
        voff[s] += p1 + __popc(bmv.w);
        mma16816(acc[s], a, b0, b1);
      }
    }
    __syncwarp();
  }
  cp_async_wait<0>();

  float* red = reinterpret_cast<float*>(smem);
  if (KS > 1) {
    __syncthreads();
#pragma unroll
    for (int s = 0; s < SPW; ++s)
#pragma unroll
      for (int r = 0; r < 4; ++r) red[((warp * SPW + s) * 4 + r) * 32 + lane] = acc[s][r];
    __syncthreads();
    if (ks != 0) return;
    for (int o = 1; o < KS; ++o)
#pragma unroll
      for (int s = 0; s < SPW; ++s)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[s][r] += red[(((warp + o) * SPW + s) * 4 + r) * 32 + lane];
  }
  if (!active) return;
#pragma unroll
  for (int s = 0; s < SPW; ++s) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int n = (strip0 + s) * 8 + 2 * (lane & 3) + j;
      if (n >= N) continue;
      const float sc = scales[n];
      const float bi = bias ? bias[n] : 0.f;
      if (gid < M) Y[static_cast<size_t>(gid) * N + n] = __float2half_rn(acc[s][j] * sc + bi);
      if (gid + 8 < M) Y[static_cast<size_t>(gid + 8) * N + n] = __float2half_rn(acc[s][2 + j] * sc + bi);
    }
  }
}


// ---------------------------------------------------------------------------------------------
// Decode path v2 (fp16 X, M <= 16, K % 8 == 0, X 4-byte aligned): "swap AB". The weights are the
// mma A operand (m16 = two strips, 16 output channels), X is the B operand (n8 = 8 rows of X; MB = 2
// blocks of 8 rows for M <= 16), so one m16n8k16 consumes four decoded 8x8 tiles (vs two with X as A)
// and M is never padded: B-fragment rows >= M are zero registers. A-fragment register r of lane l
// holds bits 2l, 2l+1 of one tile (a0: strip 0 tile 2kk, a1: strip 1 tile 2kk, a2/a3: tile 2kk+1),
// exactly the B-fragment decode of the v1 path.
//
// Latency, not issue rate, limited v1 (docs/bitmap_linear.md): per warp the next group's offsets
// came from DRAM one group ahead (a dependent load on the critical path of every cp.async issue), and
// short per-warp streams ran in 1.3-2 waves. Here each warp owns one strip pair and a K range; the
// offsets of up to 31 groups of both strips are held in two lane registers (the next window is loaded
// 31 groups ahead), so every issue is shfl + cp.async; the X fragments of group i+1 are loaded
// (read-only path, L1/L2 resident) while group i decodes; tile starts are a short popc/add chain per
// strip. The launcher sizes the grid to one wave of 8- or 16-warp blocks.
// ---------------------------------------------------------------------------------------------
// Non-volatile: pure functions of their operands, so the compiler may schedule them freely. The value
// loads read bytes that a __syncwarp made visible; their addresses come from loads issued after that
// __syncwarp, and their results feed the mma (volatile asm) that precedes the next cp.async into the
// same slot, so program order is kept where it matters.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ void lds_u16x2(uint32_t addr, uint32_t& v0, uint32_t& v1) {
  unsigned short a, b;
  asm("ld.shared.u16 %0, [%2];\n\tld.shared.u16 %1, [%2+2];\n" : "=h"(a), "=h"(b) : "r"(addr));
  v0 = a; v1 = b;
}
__device__ __forceinline__ void lds_u8x2(uint32_t addr, uint32_t& v0, uint32_t& v1) {
  asm("ld.shared.u8 %0, [%2];\n\tld.shared.u8 %1, [%2+1];\n" : "=r"(v0), "=r"(v1) : "r"(addr));
}

// Lane's two values of one tile. w: the lane's 32-bit half of the tile bitmap; ea: shared address of
// the first value of that half (tile start + popcount of the low half for lanes 16..31), prepared once
// per group by a warp scan. Both candidate values are loaded unconditionally (an address past the
// group's values stays inside the slot's 16-byte slack) and one byte permute, whose selector is looked
// up (another byte permute) from the lane's two bitmap bits, places them or zeros: bits (1,1) ->
// v0 | v1 << 16, (1,0) -> v0, (0,1) -> v0 << 16, (0,0) -> 0 (zero bytes: the loads zero-extend).
// tab: low word of the selector table (0x22102222 for fp16 values, 0x11101111 for int8 values); the
// X-staged kernels pass it as a value the compiler cannot fold, so that it stays in one register instead
// of being re-materialised by a move before every lookup.
__device__ __forceinline__ uint32_t dec_tile(uint32_t w, uint32_t ea, uint32_t below, uint32_t sh,
                                             const unsigned short*, uint32_t tab = 0x22102222u) {
  uint32_t v0, v1;
  lds_u16x2(ea + 2u * __popc(w & below), v0, v1);
  const uint32_t sel = prmt(tab, 0x54101022u, ((w >> sh) & 3u) * 0x22u + 0x10u);
  return prmt(v0, v1, sel);
}

__device__ __forceinline__ uint32_t dec_tile(uint32_t w, uint32_t ea, uint32_t below, uint32_t sh,
                                             const uint8_t*, uint32_t tab = 0x11101111u) {
  uint32_t v0, v1;
  lds_u8x2(ea + __popc(w & below), v0, v1);
  const uint32_t sel = prmt(tab, 0x14101011u, ((w >> sh) & 3u) * 0x22u + 0x10u);
  // raw int8 bytes (absent -> 0) in the low byte of each half; int8 v -> fp16 exactly: bits
  // 0x6400 | (v ^ 0x80) is 1024 + v + 128; subtract 1152 per half.
  const uint32_t bits = prmt(v0, v1, sel) ^ 0x64806480u;
  const __half2 h = __hsub2(*reinterpret_cast<const __half2*>(&bits),
                            __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480)));
  return *reinterpret_cast<const uint32_t*>(&h);
}

// XS (X staged): the group's X rows (MB x 8 rows x 64 columns, 1 KB per 8 rows) travel in the ring slot
// with the weights (16-byte cp.async, zero-filled for rows >= M and columns >= K, chunk c of row r at
// 16 (c ^ r) so that both the copy and ldmatrix are bank-conflict free) and the B fragments are built
// with ldmatrix.x4: 2 MB ldmatrix per group instead of 8 MB global loads that each touch up to 8 rows.
template <typename VT, int MB, int STAGES, bool PF, bool XS = false>
__device__ __forceinline__ void bitmap_dec_body(
    const __half* __restrict__ X, const uint8_t* __restrict__ bitmaps, const VT* __restrict__ values,
    const int* __restrict__ offsets, const float* __restrict__ scales, const float* __restrict__ bias,
    __half* __restrict__ Y, int M, int N, int K, int KS, int PB) {
  using RV = typename RawV<VT>::T;
  constexpr int kVB = kGroupK * 8 * static_cast<int>(sizeof(VT));  // max value bytes of one strip-group
  constexpr int kW = kTiles * 8 + kVB + 16;                          // one strip: bitmaps, values, slack
  constexpr int kXB = XS ? MB * 1024 : 0;                            // staged X of one group
  constexpr int kSlot = 2 * kW + kXB;                                // one stage: a strip pair (+ X)
  extern __shared__ __align__(16) uint8_t smem[];

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int S = (N + 7) >> 3;
  const int G = (K + kGroupK - 1) / kGroupK;
  const int pair = blockIdx.x * PB + warp / KS;
  const int ks = warp % KS;
  const int s0 = 2 * pair;
  const bool active = s0 < S;
  const bool has1 = s0 + 1 < S;
  const int g0 = static_cast<int>((static_cast<long long>(G) * ks) / KS);
  const int g1 = static_cast<int>((static_cast<long long>(G) * (ks + 1)) / KS);
  const int ng = active ? g1 - g0 : 0;
  const int gid = lane >> 2, t4 = lane & 3;


  // Offsets windows: lane j holds offsets[(s0 + h) * G + g0 + wbase + j] (h = 0: oa, h = 1: ob); the
  // next window (wbase + 31) is loaded when this one becomes current.
  const int* oap = offsets + static_cast<size_t>(active ? s0 : 0) * G + g0;
  const int* obp = oap + G;
  int wbase = 0, oa = 0, ob = 0, na = 0, nb = 0;
  auto ldwin = [&](int base, int& a, int& b) {
    const int j = base + lane;
    a = (active && j <= ng) ? __ldg(oap + j) : 0;
    b = (has1 && j <= ng) ? __ldg(obp + j) : 0;
  };
  ldwin(0, oa, ob);
  if (ng > 31) ldwin(31, na, nb);
  const uint8_t* bsrc = bitmaps + (static_cast<size_t>(active ? s0 + (has1 ? (lane >> 2) & 1 : 0) : 0) * G + g0) *
                                      (kTiles * 8) + 16 * (lane & 3);
  const uint32_t sbase = smem_u32(smem);
  const uint32_t sring = sbase + static_cast<uint32_t>(warp * STAGES) * kSlot;  // this warp's ring
  const uint8_t* vbytes = reinterpret_cast<const uint8_t*>(values);
  int islot = 0;  // stage slot of the next issue
  auto issue = [&](int j) {  // warp-uniform j
    if (j < ng) {
      if (j - wbase >= 31) {
        oa = na; ob = nb; wbase += 31;
        if (ng > wbase + 31) ldwin(wbase + 31, na, nb);
      }
      const int r = j - wbase;
      const int a0 = __shfl_sync(0xffffffffu, oa, r), a1 = __shfl_sync(0xffffffffu, oa, r + 1);
      const int b0 = __shfl_sync(0xffffffffu, ob, r), b1 = __shfl_sync(0xffffffffu, ob, r + 1);
      const uint32_t slot = sring + static_cast<uint32_t>(islot) * kSlot;
      if (lane < 8)  // bitmaps: lanes 0-3 strip 0, lanes 4-7 strip 1 (zero-filled when absent)
        cp_async16_zfill_s(slot + (lane >> 2) * kW + 16 * (lane & 3), bsrc + static_cast<size_t>(j) * (kTiles * 8),
                           lane < 4 || has1);
      // values: lane copies 16-byte chunks lane, lane + 32, ... of each strip (at most kVB / 512 each)
      const int ca = ((a1 - a0) * static_cast<int>(sizeof(VT))) >> 4;
      const int cb = ((b1 - b0) * static_cast<int>(sizeof(VT))) >> 4;
      const uint8_t* va = vbytes + static_cast<uint32_t>(a0 * static_cast<int>(sizeof(VT)) + 16 * lane);
      const uint8_t* vb = vbytes + static_cast<uint32_t>(b0 * static_cast<int>(sizeof(VT)) + 16 * lane);
      const uint32_t da = slot + kTiles * 8 + 16 * lane;
#pragma unroll
      for (int q = 0; q < kVB / 512; ++q)
        if (lane + 32 * q < ca) cp_async16_s(da + 512 * q, va + 512 * q);
#pragma unroll
      for (int q = 0; q < kVB / 512; ++q)
        if (lane + 32 * q < cb) cp_async16_s(da + kW + 512 * q, vb + 512 * q);
      islot = islot + 1 == STAGES ? 0 : islot + 1;
    }
    cp_async_commit();
  };

  // issue_xs (the X-staged kernels; round 4): the copies of issue() plus the group's X rows, with the
  // per-group address work hoisted out of the loop (the round-3 X-staged issue was ~110 SASS
  // instructions per group on its common path, ~7 per decoded tile; now ~88): per-lane source
  // bases and shared destinations are loop invariants, a group's value chunk c of a strip is copied
  // iff start + c·(16 / itemsize) < end, X chunks use a loop-invariant src-size (rows >= M: 0) and
  // check columns only in the K-tail group (warp-uniform), the slot address rotates by addition.
  constexpr int kVPC = 16 / static_cast<int>(sizeof(VT));  // values per 16-byte chunk
  const uint8_t* vlane = vbytes + 16 * lane;
  const int vlpos = kVPC * lane;
  // X chunk q of this lane: idx = lane + 32 q, row 8 (q >> 1) + (lane >> 3) + 4 (q & 1), 16-byte chunk
  // lane & 7 (columns 8 (lane & 7) ..); element offset in X of group 0 of this warp; src-size.
  const int xcol = 8 * (lane & 7);
  const int xrow0 = lane >> 3;
  int xoff[XS ? 2 * MB : 1];
  int xsz = 0;  // bit q: row of chunk q < M
#pragma unroll
  for (int q = 0; q < (XS ? 2 * MB : 1); ++q) {
    const int row = 8 * (q >> 1) + xrow0 + 4 * (q & 1);
    xoff[q] = (row < M ? row : 0) * K + xcol + g0 * kGroupK;
    xsz |= (row < M ? 1 : 0) << q;
  }
  // shared destination of chunk q: block q >> 1 (1 KB), row r = xrow0 + 4 (q & 1), chunk xc ^ r
  const uint32_t xd0 = static_cast<uint32_t>(xrow0 * 128 + (((lane & 7) ^ xrow0) << 4));
  const uint32_t xd1 = (xd0 ^ 64u) + 512u;
  const uint8_t* bsrc_l = bsrc;
  const uint32_t send = sring + STAGES * kSlot;
  uint32_t islot_a = sring;
  const bool blane = lane < 8;
  const uint32_t bsz = (lane < 4 || has1) ? 16u : 0u;
  const uint32_t bdst = (lane >> 2) * kW + 16 * (lane & 3);
  auto issue_xs = [&](int j) {  // warp-uniform j
    if (j < ng) {
      if (j - wbase >= 31) {
        oa = na; ob = nb; wbase += 31;
        if (ng > wbase + 31) ldwin(wbase + 31, na, nb);
      }
      const int r = j - wbase;
      const int a0 = __shfl_sync(0xffffffffu, oa, r), a1 = __shfl_sync(0xffffffffu, oa, r + 1);
      const int b0 = __shfl_sync(0xffffffffu, ob, r), b1 = __shfl_sync(0xffffffffu, ob, r + 1);
      const uint32_t slot = islot_a;
      if (blane)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(slot + bdst),
                     "l"(bsrc_l + static_cast<uint32_t>(j) * (kTiles * 8)), "r"(bsz));
      const int pa = a0 + vlpos, pb = b0 + vlpos;
      const uint8_t* va = vlane + static_cast<uint32_t>(a0) * sizeof(VT);
      const uint8_t* vb = vlane + static_cast<uint32_t>(b0) * sizeof(VT);
      const uint32_t da = slot + kTiles * 8 + 16 * lane;
#pragma unroll
      for (int q = 0; q < kVB / 512; ++q)
        if (pa + q * 32 * kVPC < a1) cp_async16_s(da + 512 * q, va + 512 * q);
#pragma unroll
      for (int q = 0; q < kVB / 512; ++q)
        if (pb + q * 32 * kVPC < b1) cp_async16_s(da + kW + 512 * q, vb + 512 * q);
      if constexpr (XS) {
        const int kj = j * kGroupK;
        const uint32_t xs = slot + 2 * kW;
        if ((g0 + j + 1) * kGroupK <= K) {  // warp-uniform: the whole group inside K
#pragma unroll
          for (int q = 0; q < 2 * MB; ++q)
            cp_async16_zfill_s(xs + (q & 1 ? xd1 : xd0) + 1024 * (q >> 1), X + (xoff[q] + kj), (xsz >> q) & 1);
        } else {
          const bool cok = (g0 + j) * kGroupK + xcol < K;
#pragma unroll
          for (int q = 0; q < 2 * MB; ++q) {
            const bool ok = cok && ((xsz >> q) & 1);
            cp_async16_zfill_s(xs + (q & 1 ? xd1 : xd0) + 1024 * (q >> 1), ok ? X + (xoff[q] + kj) : X, ok);
          }
        }
      }
      islot_a = slot + kSlot == send ? sring : slot + kSlot;
      islot = islot + 1 == STAGES ? 0 : islot + 1;
    }
    cp_async_commit();
  };

  // X fragments (B operand): row gid (+8 for mb = 1), columns 16 kk + 2 t4 (+8) of the group. Rows
  // >= M are clamped to row M - 1: they only feed D columns >= M, which are never stored.
  const unsigned int* xp0 = reinterpret_cast<const unsigned int*>(X + static_cast<size_t>(min(gid, M - 1)) * K + 2 * t4);
  const unsigned int* xp1 = reinterpret_cast<const unsigned int*>(X + static_cast<size_t>(min(gid + 8, M - 1)) * K + 2 * t4);
  auto ldx = [&](int j, uint32_t (&xf)[MB][8]) {
    const int kb = (g0 + j) * kGroupK;  // in halves; 32-bit words: kb / 2
    if (kb + kGroupK <= K) {  // warp-uniform: whole group inside K
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        xf[0][q] = __ldg(xp0 + kb / 2 + 4 * q);
        if (MB == 2) xf[MB - 1][q] = __ldg(xp1 + kb / 2 + 4 * q);
      }
    } else {
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const bool ok = kb + 8 * q < K;  // this lane's column is kb + 8 q + 2 t4; K % 8 == 0
        xf[0][q] = ok ? __ldg(xp0 + kb / 2 + 4 * q) : 0u;
        if (MB == 2) xf[MB - 1][q] = ok ? __ldg(xp1 + kb / 2 + 4 * q) : 0u;
      }
    }
  };

  // Per-group scan: lane j owns bitmap word j & 15 of strip j >> 4; the exclusive prefix of the word
  // popcounts gives the shared address of each word's first value. (word, address) pairs go to a
  // per-warp scratch in [strip][half h][tile] order, so a lane of half h reads its words and addresses
  // for two tiles with one 16-byte load.
  const int wi = lane & 15, hs = lane >> 4;
  const uint32_t scr = static_cast<uint32_t>(blockDim.x >> 5) * STAGES * kSlot + warp * 256;  // offsets
  const uint32_t scr_st = scr + hs * 128 + (wi & 1) * 64 + (wi >> 1) * 8;
  const uint32_t scr_ld = scr + (lane >= 16 ? 64 : 0);
  const uint32_t sh = 2u * static_cast<uint32_t>(lane & 15);
  const uint32_t below = (1u << sh) - 1u;
  // Selector table word for dec_tile; M is 1..16 here, so the OR adds nothing, but the compiler cannot
  // know it and keeps the word in a register (X-staged kernels).
  const uint32_t tab = (sizeof(VT) == 2 ? 0x22102222u : 0x11101111u) | (static_cast<uint32_t>(M) & 0x80000000u);

  float acc[MB][4];
#pragma unroll
  for (int b = 0; b < MB; ++b)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[b][r] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if constexpr (XS) issue_xs(s); else issue(s);
  }
  // X fragments of the current group (xf) and, with PF, of the next one (xn, loaded a group ahead).
  // Without PF (80-register kernels with MB = 2) the group's X is loaded at the top of its iteration,
  // before the ring wait and the scan, and other resident warps cover the L1/L2 latency.
  uint32_t xf[XS ? 1 : MB][XS ? 1 : 8], xn[PF ? MB : 1][PF ? 8 : 1];
  if constexpr (PF) {
    if (ng > 0) ldx(0, xf);
  }
  // XS: lane l addresses row l & 7 of matrix l >> 3 (chunk 4 kp + (l >> 3)) of each ldmatrix.x4.
  const uint32_t xr_l = static_cast<uint32_t>(lane & 7), xc_l = static_cast<uint32_t>(lane >> 3);
  int cslot = 0;  // stage slot being consumed

  for (int i = 0; i < ng; ++i) {
    if constexpr (XS) issue_xs(i + STAGES - 1); else issue(i + STAGES - 1);
    if constexpr (PF) {
      if (i + 1 < ng) ldx(i + 1, xn);
    } else if constexpr (!XS) {
      ldx(i, xf);
    }
    cp_async_wait<STAGES - 1>();
    __syncwarp();
    {
      const uint32_t st = static_cast<uint32_t>(warp * STAGES + cslot) * kSlot + hs * kW;  // offset from smem
      const uint32_t word = *reinterpret_cast<const uint32_t*>(smem + st + 4 * wi);
      const uint32_t p = __popc(word);
      uint32_t x = p;
#pragma unroll
      for (int d = 1; d < 16; d *= 2) {
        const uint32_t y = __shfl_up_sync(0xffffffffu, x, d, 16);
        if (wi >= d) x += y;
      }
      const uint32_t ea = sbase + st + kTiles * 8 + (x - p) * static_cast<uint32_t>(sizeof(VT));
      *reinterpret_cast<uint2*>(smem + scr_st) = make_uint2(word, ea);
    }
    __syncwarp();
    const uint32_t xsl = sbase + static_cast<uint32_t>(warp * STAGES + cslot) * kSlot + 2 * kW + xr_l * 128;
    uint32_t xb[XS ? MB : 1][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if constexpr (XS) {
        if ((kk & 1) == 0) {
#pragma unroll
          for (int b = 0; b < MB; ++b)
            ldmatrix_x4(xb[b], xsl + b * 1024 + ((((2 * kk) | xc_l) ^ xr_l) << 4));
        }
      }
      const uint4 m0 = *reinterpret_cast<const uint4*>(smem + scr_ld + 16 * kk);  // strip 0: (word, offset) of tiles 2kk, 2kk+1
      const uint4 m1 = *reinterpret_cast<const uint4*>(smem + scr_ld + 128 + 16 * kk);  // strip 1
      uint32_t a[4];
      if constexpr (XS) {
        a[0] = dec_tile(m0.x, m0.y, below, sh, static_cast<const RV*>(nullptr), tab);
        a[1] = dec_tile(m1.x, m1.y, below, sh, static_cast<const RV*>(nullptr), tab);
        a[2] = dec_tile(m0.z, m0.w, below, sh, static_cast<const RV*>(nullptr), tab);
        a[3] = dec_tile(m1.z, m1.w, below, sh, static_cast<const RV*>(nullptr), tab);
      } else {
        a[0] = dec_tile(m0.x, m0.y, below, sh, static_cast<const RV*>(nullptr));
        a[1] = dec_tile(m1.x, m1.y, below, sh, static_cast<const RV*>(nullptr));
        a[2] = dec_tile(m0.z, m0.w, below, sh, static_cast<const RV*>(nullptr));
        a[3] = dec_tile(m1.z, m1.w, below, sh, static_cast<const RV*>(nullptr));
      }
      if constexpr (XS) {
#pragma unroll
        for (int b = 0; b < MB; ++b) mma16816(acc[b], a, xb[b][2 * (kk & 1)], xb[b][2 * (kk & 1) + 1]);
      } else {
#pragma unroll
        for (int b = 0; b < MB; ++b) mma16816(acc[XS ? 0 : b], a, xf[XS ? 0 : b][2 * kk], xf[XS ? 0 : b][2 * kk + 1]);
      }
    }
    if constexpr (PF) {
#pragma unroll
      for (int b = 0; b < MB; ++b)
#pragma unroll
        for (int q = 0; q < 8; ++q) xf[b][q] = xn[PF ? b : 0][PF ? q : 0];
    }
    cslot = cslot + 1 == STAGES ? 0 : cslot + 1;
    __syncwarp();
  }
  cp_async_wait<0>();

  float* red = reinterpret_cast<float*>(smem);
  if (KS > 1) {
    __syncthreads();
#pragma unroll
    for (int b = 0; b < MB; ++b)
#pragma unroll
      for (int r = 0; r < 4; ++r) red[((warp * MB + b) * 4 + r) * 32 + lane] = acc[b][r];
    __syncthreads();
    if (ks != 0) return;
    for (int o = 1; o < KS; ++o)
#pragma unroll
      for (int b = 0; b < MB; ++b)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[b][r] += red[(((warp + o) * MB + b) * 4 + r) * 32 + lane];
  }
  if (!active) return;
  // D (m16 x n8): lane holds channels 8 s0 + gid (acc 0, 1) and 8 (s0 + 1) + gid (acc 2, 3), X rows
  // 8 b + 2 t4 (acc 0, 2) and + 1 (acc 1, 3).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int n = 8 * (s0 + h) + gid;
    if (n >= N) continue;
    const float sc = scales[n];
    const float bi = bias ? bias[n] : 0.f;
#pragma unroll
    for (int b = 0; b < MB; ++b) {
      const int m = 8 * b + 2 * t4;
      if (m < M) Y[static_cast<size_t>(m) * N + n] = __float2half_rn(acc[b][2 * h] * sc + bi);
      if (m + 1 < M) Y[static_cast<size_t>(m + 1) * N + n] = __float2half_rn(acc[b][2 * h + 1] * sc + bi);
    }
  }
}

}  // namespace

// extern "C" entry points: bitmap_linear_<x dtype>_<value dtype>_mt<MT>_s<STAGES>.
#define EDGESDK_BITMAP_LINEAR(XT, XN, VT, VN, MT, ST)                                                   \
  extern "C" __global__ void __launch_bounds__(512, 1) bitmap_linear_##XN##_##VN##_mt##MT##_s##ST(         \
      const XT* __restrict__ X, const uint8_t* __restrict__ bitmaps, const VT* __restrict__ values,     \
      const int* __restrict__ offsets, const float* __restrict__ scales, const float* __restrict__ bias, \
      XT* __restrict__ Y, int M, int N, int K, int KS, int SPB) {                                        \
    bitmap_linear_body<XT, VT, MT, ST>(X, bitmaps, values, offsets, scales, bias, Y, M, N, K, KS, SPB);  \
  }

#define EDGESDK_BITMAP_LINEAR_MT(XT, XN, VT, VN, ST) \
  EDGESDK_BITMAP_LINEAR(XT, XN, VT, VN, 1, ST)       \
  EDGESDK_BITMAP_LINEAR(XT, XN, VT, VN, 2, ST)       \
  EDGESDK_BITMAP_LINEAR(XT, XN, VT, VN, 4, ST)

EDGESDK_BITMAP_LINEAR_MT(__half, f16, __half, f16, 4)
EDGESDK_BITMAP_LINEAR_MT(__half, f16, int8_t, i8, 4)
EDGESDK_BITMAP_LINEAR_MT(float, f32, __half, f16, 4)
EDGESDK_BITMAP_LINEAR_MT(float, f32, int8_t, i8, 4)
EDGESDK_BITMAP_LINEAR(__half, f16, __half, f16, 1, 8)
EDGESDK_BITMAP_LINEAR(__half, f16, int8_t, i8, 1, 8)

// Decode path entry points: bitmap_gemv_<value dtype>_w<SPW>_s<STAGES> (fp16 X and Y, M <= 16, K % 8 == 0).
#define EDGESDK_BITMAP_GEMV(VT, VN, SPW, ST)                                                             \
  extern "C" __global__ void __launch_bounds__(512, 1) bitmap_gemv_##VN##_w##SPW##_s##ST(               \
      const __half* __restrict__ X, const uint8_t* __restrict__ bitmaps, const VT* __restrict__ values,  \
      const int* __restrict__ offsets, const float* __restrict__ scales, const float* __restrict__ bias,   \
      __half* __restrict__ Y, int M, int N, int K, int KS, int SPB) {                                      \
    bitmap_gemv_body<VT, SPW, ST>(X, bitmaps, values, offsets, scales, bias, Y, M, N, K, KS, SPB);         \
  }

EDGESDK_BITMAP_GEMV(__half, f16, 1, 4)
EDGESDK_BITMAP_GEMV(__half, f16, 2, 4)
EDGESDK_BITMAP_GEMV(__half, f16, 4, 4)
EDGESDK_BITMAP_GEMV(int8_t, i8, 1, 4)
EDGESDK_BITMAP_GEMV(int8_t, i8, 2, 4)
EDGESDK_BITMAP_GEMV(int8_t, i8, 4, 4)


// Decode path v2 entry points: bitmap_dec_<value dtype>_mb<MB>_s<STAGES> (fp16 X and Y, M <= 8 MB,
// K % 8 == 0). Launch: grid ceil(ceil(S / 2) / PB), block 32 PB KS (warp w: strip pair
// blockIdx.x PB + w / KS, K split w % KS), dynamic smem = warps · STAGES · 2 · (64 + 512 · itemsize + 16).
#define EDGESDK_BITMAP_DEC(VT, VN, MB, ST)                                                              \
  extern "C" __global__ void __launch_bounds__(512, 1) bitmap_dec_##VN##_mb##MB##_s##ST(               \
      const __half* __restrict__ X, const uint8_t* __restrict__ bitmaps, const VT* __restrict__ values,  \
      const int* __restrict__ offsets, const float* __restrict__ scales, const float* __restrict__ bias,   \
      __half* __restrict__ Y, int M, int N, int K, int KS, int PB) {                                       \
    bitmap_dec_body<VT, MB, ST, true>(X, bitmaps, values, offsets, scales, bias, Y, M, N, K, KS, PB);            \
  }

EDGESDK_BITMAP_DEC(__half, f16, 1, 4)
EDGESDK_BITMAP_DEC(__half, f16, 2, 4)
EDGESDK_BITMAP_DEC(__half, f16, 1, 6)
EDGESDK_BITMAP_DEC(__half, f16, 2, 6)
EDGESDK_BITMAP_DEC(int8_t, i8, 1, 6)
EDGESDK_BITMAP_DEC(int8_t, i8, 2, 6)
EDGESDK_BITMAP_DEC(int8_t, i8, 1, 8)
EDGESDK_BITMAP_DEC(int8_t, i8, 2, 8)

// 80-register variants of the decode path: bitmap_dec_<value dtype>_mb<MB>_s<STAGES>_r<PF><...>, suffix
// "_r80" (X prefetched one group ahead) or "_r80n" (X loaded per group). __launch_bounds__(768, 1)
// caps registers at 80 so that 24 warps fit an SM (H100: three 8-warp or two 12-warp blocks; the
// shared memory of the ring decides how many blocks fit on Orin). Same launch and layout as above.
#define EDGESDK_BITMAP_DEC_R80(VT, VN, MB, ST, PF, SFX)                                                  \
  extern "C" __global__ void __launch_bounds__(768, 1) bitmap_dec_##VN##_mb##MB##_s##ST##_##SFX(       \
      const __half* __restrict__ X, const uint8_t* __restrict__ bitmaps, const VT* __restrict__ values,  \
      const int* __restrict__ offsets, const float* __restrict__ scales, const float* __restrict__ bias,   \
      __half* __restrict__ Y, int M, int N, int K, int KS, int PB) {                                       \
    bitmap_dec_body<VT, MB, ST, PF>(X, bitmaps, values, offsets, scales, bias, Y, M, N, K, KS, PB);        \
  }

EDGESDK_BITMAP_DEC_R80(__half, f16, 1, 4, true, r80)
EDGESDK_BITMAP_DEC_R80(__half, f16, 2, 4, false, r80n)
EDGESDK_BITMAP_DEC_R80(int8_t, i8, 1, 6, true, r80)
EDGESDK_BITMAP_DEC_R80(int8_t, i8, 2, 6, false, r80n)

// X-staged variants (XS, see bitmap_dec_body): bitmap_dec_<value dtype>_mb<MB>_s<STAGES>_xs, 16-warp
// build; ring slot = 2 strips + MB KB of X. Same launch and layout as above.
#define EDGESDK_BITMAP_DEC_XS(VT, VN, MB, ST)                                                             \
  extern "C" __global__ void __launch_bounds__(512, 1) bitmap_dec_##VN##_mb##MB##_s##ST##_xs(           \
      const __half* __restrict__ X, const uint8_t* __restrict__ bitmaps, const VT* __restrict__ values,  \
      const int* __restrict__ offsets, const float* __restrict__ scales, const float* __restrict__ bias,   \
      __half* __restrict__ Y, int M, int N, int K, int KS, int PB) {                                       \
    bitmap_dec_body<VT, MB, ST, false, true>(X, bitmaps, values, offsets, scales, bias, Y, M, N, K, KS, PB); \
  }

EDGESDK_BITMAP_DEC_XS(__half, f16, 1, 3)
EDGESDK_BITMAP_DEC_XS(__half, f16, 2, 3)
EDGESDK_BITMAP_DEC_XS(int8_t, i8, 1, 4)
EDGESDK_BITMAP_DEC_XS(int8_t, i8, 2, 3)

// 80-register builds of the X-staged kernels (__launch_bounds__(768, 1): up to 24 warps per SM where
// the ring fits): bitmap_dec_<value dtype>_mb<MB>_s<STAGES>_xs80.
#define EDGESDK_BITMAP_DEC_XS80(VT, VN, MB, ST)                                                           \
  extern "C" __global__ void __launch_bounds__(768, 1) bitmap_dec_##VN##_mb##MB##_s##ST##_xs80(         \
      const __half* __restrict__ X, const uint8_t* __restrict__ bitmaps, const VT* __restrict__ values,  \
      const int* __restrict__ offsets, const float* __restrict__ scales, const float* __restrict__ bias,   \
      __half* __restrict__ Y, int M, int N, int K, int KS, int PB) {                                       \
    bitmap_dec_body<VT, MB, ST, false, true>(X, bitmaps, values, offsets, scales, bias, Y, M, N, K, KS, PB); \
  }

EDGESDK_BITMAP_DEC_XS80(__half, f16, 1, 3)
EDGESDK_BITMAP_DEC_XS80(__half, f16, 2, 3)
EDGESDK_BITMAP_DEC_XS80(int8_t, i8, 1, 4)
EDGESDK_BITMAP_DEC_XS80(int8_t, i8, 2, 3)

