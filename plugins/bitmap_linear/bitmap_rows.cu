// EdgeBitmapLinear, row-walk path (round 8, an experiment measured against the decode path; see
// docs/bitmap_linear.md "Round 8"): Y[M, N] = X[M, K] · Wᵀ · diag(scales) + bias for small M on CUDA
// cores, over the *row layout* that edgesdk/formats/bitmap_linear.py (`row_layout`) derives from the
// stored format on the host:
//
//   masks  uint32 [N][NWP]   word j of row n: bit i set iff W[n, 32 j + i] is stored; NW = ceil(K / 32) words,
//                            NWP = round_up(NW, 4) (16-byte rows);
//   values fp16/int8 [...]   the stored values of row n in column order from segoff[n][0] on; every row
//                            starts 16-byte aligned;
//   segoff int32 [N][NSEG+1] index into values of the first value of row n at word SEGW·s (s < NSEG),
//                            segoff[n][NSEG] = the end of row n's values.
//
// Why: the decode path costs ~21 warp-instructions per 8x8 tile at any sparsity (its decode is per
// *position*); here a lane walks one row's set bits and costs ~12 + M instructions per *stored value*,
// so at 50-70 % sparsity and M <= 4 it issues 2-3x fewer instructions per weight.
//
// Launch: grid ceil(N / RPW), block 32·KS threads. Lane l of warp w takes row blockIdx.x·RPW + l % RPW
// and part q = w·(32 / RPW) + l / RPW of the row's P = KS·32 / RPW parts (segments q·NSEG/P .. (q+1)·NSEG/P).
// Per lane: its mask words are copied once (cp.async) and compacted in shared memory into (word, column
// base) pairs of the non-empty words (so the walk never meets an empty word); its values stream from global memory in 16-byte
// vectors three ahead; per stored value: find and clear the lowest set bit, X[column] from shared memory (fp32,
// [K][MP]), fp32 FMA per row of X. Parts of one row are reduced by shuffles, then across warps in shared
// memory in a fixed order (deterministic). Dynamic smem = NW·32·MP·4 + RPW·NWP·8 + 16 + KS·RPW·MP·4.
// Ampere instructions only; compiled for sm_87 and sm_90.
#include <cuda_fp16.h>
#include <stdint.h>

#include "common/ampere.cuh"

// Timing ablations (tools/bitmap_rows_explore.py --ablate; wrong results): 1 = every lane reads lane 0's
// value vectors (coalesced), 2 = no shared-memory X load, 3 = no bit walk (fixed columns).
#ifndef EDGESDK_ROWS_ABLATE
#define EDGESDK_ROWS_ABLATE 0
#endif

namespace {

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src));
}

__device__ __forceinline__ uint32_t bfind(uint32_t x) {
  uint32_t r;
  asm("bfind.u32 %0, %1;" : "=r"(r) : "r"(x));
  return r;
}

template <typename VT> struct Vec;
template <> struct Vec<__half> { static constexpr int kN = 8; };
template <> struct Vec<int8_t> { static constexpr int kN = 16; };

// Value j of a 16-byte vector as fp32.
template <typename VT>
__device__ __forceinline__ float vec_at(const uint4& v, int j);
template <>
__device__ __forceinline__ float vec_at<__half>(const uint4& v, int j) {
  const uint32_t w = j < 2 ? v.x : j < 4 ? v.y : j < 6 ? v.z : v.w;
  return __half2float(__ushort_as_half(static_cast<unsigned short>((j & 1) ? w >> 16 : w & 0xffffu)));
}
template <>
__device__ __forceinline__ float vec_at<int8_t>(const uint4& v, int j) {
  const uint32_t w = j < 4 ? v.x : j < 8 ? v.y : j < 12 ? v.z : v.w;
  return static_cast<float>(static_cast<int8_t>(w >> (8 * (j & 3))));
}

__device__ __forceinline__ uint4 ldg_vec(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

// Walk state of one lane: the current mask word (bits not yet consumed), the byte offset of X[its column
// base], and the next non-empty (word, offset) pair, loaded from shared memory when the current word runs
// out. The lowest set bit is consumed first (cur &= cur - 1: a two-instruction dependency chain per value;
// its position comes off the chain from bfind(cur ^ (cur - 1))).
template <int MP>
struct Walk {
  uint32_t cur, wb, nw, nb;
  const uint2* ptr;  // the pair after (nw, nb)

  // Byte offset of X[column of the next stored value][0] in the shared copy.
  __device__ __forceinline__ uint32_t next_off() {
    const uint32_t t = cur - 1u;
    const uint32_t off = wb + bfind(cur ^ t) * (4u * MP);
    cur &= t;
    if (cur == 0u) {  // word exhausted (divergent, short): take the prefetched pair, fetch the next one
      cur = nw;
      wb = nb;
      const uint2 q = *ptr++;
      nw = q.x;
      nb = q.y;
    }
    return off;
  }
};

template <typename VT, int MP, bool CHECK>
__device__ __forceinline__ void consume(const uint4& v, int lo, int hi, Walk<MP>& wk, const uint8_t* __restrict__ xs,
                                        float (&acc)[MP]) {
  constexpr int VN = Vec<VT>::kN;
#pragma unroll
  for (int j = 0; j < VN; ++j) {
    if (!CHECK || (j >= lo && j < hi)) {
#if EDGESDK_ROWS_ABLATE == 3
      const uint32_t off = wk.wb + j * (4u * MP);
#else
      const uint32_t off = wk.next_off();
#endif
      const float w = vec_at<VT>(v, j);
      if constexpr (MP == 1) {
#if EDGESDK_ROWS_ABLATE == 2
        acc[0] = fmaf(w, __uint_as_float(off), acc[0]);
#else
        acc[0] = fmaf(w, *reinterpret_cast<const float*>(xs + off), acc[0]);
#endif
      } else if constexpr (MP == 2) {
        const float2 x = *reinterpret_cast<const float2*>(xs + off);
        acc[0] = fmaf(w, x.x, acc[0]);
        acc[1] = fmaf(w, x.y, acc[1]);
      } else {
        const float4 x = *reinterpret_cast<const float4*>(xs + off);
        acc[0] = fmaf(w, x.x, acc[0]);
        acc[1] = fmaf(w, x.y, acc[1]);
        acc[2] = fmaf(w, x.z, acc[2]);
        acc[3] = fmaf(w, x.w, acc[3]);
      }
    }
  }
}

template <typename VT, int MP>
__device__ __forceinline__ void bitmap_rows_body(const __half* __restrict__ X, const uint32_t* __restrict__ masks,
                                                 const VT* __restrict__ values, const int* __restrict__ segoff,
                                                 const float* __restrict__ scales, const float* __restrict__ bias,
                                                 __half* __restrict__ Y, int M, int N, int K, int NW, int NWP,
                                                 int NSEG, int SEGW, int RPW) {
  constexpr int VN = Vec<VT>::kN;
  extern __shared__ __align__(16) uint8_t smem[];
  const int KS = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int KP = NW * 32;  // staged columns (zeros beyond K)
  float* xs = reinterpret_cast<float*>(smem);                    // [KP][MP]
  uint2* pairs = reinterpret_cast<uint2*>(smem + KP * MP * 4);   // [RPW][NWP] (+ 16 bytes of slack)
  float* red = reinterpret_cast<float*>(smem + KP * MP * 4 + RPW * NWP * 8 + 16);  // [KS][RPW][MP]

  const int r = lane % RPW, lpw = 32 / RPW;
  const int n = blockIdx.x * RPW + r;
  const int P = KS * lpw, q = warp * lpw + lane / RPW;
  const int s0 = static_cast<int>(static_cast<long long>(q) * NSEG / P);
  const int s1 = static_cast<int>(static_cast<long long>(q + 1) * NSEG / P);
  const bool live = n < N && s1 > s0;
  int v0 = 0, v1 = 0;
  if (live) {
    v0 = segoff[static_cast<size_t>(n) * (NSEG + 1) + s0];
    v1 = segoff[static_cast<size_t>(n) * (NSEG + 1) + s1];
  }
#if EDGESDK_ROWS_ABLATE == 1
  const uint4* vv = reinterpret_cast<const uint4*>(values) + (__shfl_sync(0xffffffffu, v0 / VN, 0) - v0 / VN);
#else
  const uint4* vv = reinterpret_cast<const uint4*>(values);
#endif
  const int a0 = v0 / VN, a1 = (v1 + VN - 1) / VN;  // this lane's 16-byte vectors [a0, a1)
  // Values first: their loads are in flight while the masks and X are staged.
  uint4 buf[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    buf[i] = a0 + i < a1 ? ldg_vec(vv + a0 + i) : make_uint4(0u, 0u, 0u, 0u);

  // This lane's raw mask words [j0, j1p) by cp.async into the top half of its pair area (compacted in
  // place below: pair k is written only after the words it could overlap have been read).
  const int j0 = s0 * SEGW, j1p = min(s1 * SEGW, NWP);  // multiples of 4 (SEGW % 4 == 0)
  uint2* mine = pairs + r * NWP + j0;
  uint32_t* raw = reinterpret_cast<uint32_t*>(mine) + (j1p - j0);
  if (live) {
    const uint32_t* src = masks + static_cast<size_t>(n) * NWP;
    for (int j = j0; j < j1p; j += 4) cp_async16(raw + (j - j0), src + j);
  }
  cp_async_commit();
  // X as fp32 [KP][MP] (rows m < M; other entries are never read into a stored output: columns >= K have
  // no mask bits, rows >= M are not written back). 16-byte loads, four in flight per thread.
  if ((K & 7) == 0 && (reinterpret_cast<uintptr_t>(X) & 15) == 0) {
    const int CH = K >> 3;
    for (int m = 0; m < M; ++m) {
      const uint4* xr = reinterpret_cast<const uint4*>(X + static_cast<size_t>(m) * K);
#pragma unroll 4
      for (int c = threadIdx.x; c < CH; c += blockDim.x) {
        const uint4 v = __ldg(xr + c);
        const uint32_t h[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h[i]));
          xs[(8 * c + 2 * i) * MP + m] = f.x;
          xs[(8 * c + 2 * i + 1) * MP + m] = f.y;
        }
      }
    }
  } else {
    for (int m = 0; m < M; ++m) {
#pragma unroll 4
      for (int c = threadIdx.x; c < K; c += blockDim.x) xs[c * MP + m] = __half2float(X[static_cast<size_t>(m) * K + c]);
    }
  }
  cp_async_wait<0>();
  // (word, byte offset of X[column base]) pairs of the non-empty words, in order.
  int cnt = 0;
  if (live) {
    for (int j = j0; j < j1p; j += 4) {
      const uint4 w4 = *reinterpret_cast<const uint4*>(raw + (j - j0));
      const uint32_t w[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
      for (int t = 0; t < 4; ++t)
        if (w[t] != 0u) mine[cnt++] = make_uint2(w[t], 32u * (j + t) * (4u * MP));
    }
  }
  __syncthreads();

  float acc[MP];
#pragma unroll
  for (int m = 0; m < MP; ++m) acc[m] = 0.f;
  if (live && v1 > v0) {
    Walk<MP> wk;
    wk.cur = mine[0].x;
    wk.wb = mine[0].y;
    const uint2 nx = mine[cnt > 1 ? 1 : 0];
    wk.nw = nx.x;
    wk.nb = nx.y;
    wk.ptr = mine + 2;
    const int nv = a1 - a0, head = v0 - a0 * VN, tail = v1 - (a1 - 1) * VN;
    consume<VT, MP, true>(buf[0], head, nv == 1 ? tail : VN, wk, smem, acc);
    if (4 < nv) buf[0] = ldg_vec(vv + a0 + 4);
    // Full vectors 1 .. nv - 2: vector t sits in buf[t % 4] (static after the unroll by 4) and is
    // replaced by vector t + 4 once consumed, so three vectors stay in flight.
    for (int t0 = 1; t0 < nv - 1; t0 += 4) {
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int t = t0 + u;
        if (t < nv - 1) {
          consume<VT, MP, false>(buf[(1 + u) & 3], 0, VN, wk, smem, acc);
          if (t + 4 < nv) buf[(1 + u) & 3] = ldg_vec(vv + a0 + t + 4);
        }
      }
    }
    if (nv > 1) {
      const int sl = (nv - 1) & 3;
      const uint4 last = sl == 0 ? buf[0] : sl == 1 ? buf[1] : sl == 2 ? buf[2] : buf[3];
      consume<VT, MP, true>(last, 0, tail, wk, smem, acc);
    }
  }
  // Sum the parts of one row: lanes l, l + RPW, ... of this warp (shuffles), then the warps (fixed order).
#pragma unroll
  for (int m = 0; m < MP; ++m)
    for (int o = RPW; o < 32; o <<= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
  if (lane < RPW) {
#pragma unroll
    for (int m = 0; m < MP; ++m) red[(warp * RPW + lane) * MP + m] = acc[m];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < RPW * MP; e += blockDim.x) {
    const int rr = e / MP, m = e - rr * MP, nn = blockIdx.x * RPW + rr;
    if (nn >= N || m >= M) continue;
    float s = 0.f;
    for (int w = 0; w < KS; ++w) s += red[(w * RPW + rr) * MP + m];
    Y[static_cast<size_t>(m) * N + nn] = __float2half_rn(s * scales[nn] + (bias ? bias[nn] : 0.f));
  }
}

}  // namespace

// bitmap_rows_<value dtype>_m<MP>: M <= MP rows of fp16 X.
#define EDGESDK_BITMAP_ROWS(VT, VN, MP)                                                                   \
  extern "C" __global__ void __launch_bounds__(512, 1) bitmap_rows_##VN##_m##MP(                         \
      const __half* __restrict__ X, const uint32_t* __restrict__ masks, const VT* __restrict__ values,     \
      const int* __restrict__ segoff, const float* __restrict__ scales, const float* __restrict__ bias,    \
      __half* __restrict__ Y, int M, int N, int K, int NW, int NWP, int NSEG, int SEGW, int RPW) {           \
    bitmap_rows_body<VT, MP>(X, masks, values, segoff, scales, bias, Y, M, N, K, NW, NWP, NSEG, SEGW, RPW); \
  }

EDGESDK_BITMAP_ROWS(__half, f16, 1)
EDGESDK_BITMAP_ROWS(__half, f16, 2)
EDGESDK_BITMAP_ROWS(__half, f16, 4)
EDGESDK_BITMAP_ROWS(int8_t, i8, 1)
EDGESDK_BITMAP_ROWS(int8_t, i8, 2)
EDGESDK_BITMAP_ROWS(int8_t, i8, 4)
