// VitBit INT8 GEMM for EdgeVitBitGemm: Y = epilogue(quantize(X) . W^T), exact int32 accumulation.
//
// Semantics: edgesdk/reference/vitbit_gemm.py (every step one IEEE fp32 op, no FMA contraction).
// Layout:    edgesdk/formats/vitbit_gemm.py (W int8 [N, Kp], Kp = K rounded up to 16, pad = 0).
//
// Kernels (extern "C", instantiated below):
//   vitbit_quantize_{f16,f32}:  X [M, K] -> Xq int8 [M, Kp] (workspace), q = clip(rint(x / s)), NaN -> 0.
//   vitbit_pad_i8:              int8 X (already quantized) -> Xq [M, Kp] where the GEMM cannot read X itself.
//   vitbit_gemm_<cfg>:          Xq . W^T for one block tile BM x (BN_TC + BN_INT + BN_FP) per CTA,
//                               K split over gridDim.z when `partial` is given (int32 partials, no epilogue).
//   vitbit_splitk_epilogue:     sums the int32 partials (exact) and applies the epilogue.
//
// One fused GEMM kernel whose warps take roles on columns of the block tile (VitBit's split):
//   tensor-core warps: mma.sync.m16n8k32.s8 on BN_TC columns (ldmatrix from a swizzled smem tile);
//   INT-core warps:    BN_INT columns, dp4a on 4 x int8 words (INT_MODE 0) or, for 4/5-bit weights, two
//                      16-bit fields per 32-bit IMAD (INT_MODE 4/5), extracted every FIELD_FLUSH values of K;
//   FP-core warps:     BN_FP columns, int8 -> fp32 (exact magic-number conversion) and FFMA, flushed to
//                      int32 every 1024 values of K (8 k-tiles).
// All roles read the same cp.async multistage pipeline (BK = 128 bytes, STAGES deep).
//
// Exactness bounds (proofs in edgesdk/formats/vitbit_gemm.py):
//   int32: |acc| <= K * 2^14 <= 2^31 - 1 for K <= 131071 (checked by the launcher).
//   fp32:  every FFMA partial sum is an integer of magnitude <= 1024 * 2^14 = 2^24: exact.
//   fields: after T multiply-adds a field holds v in [-T*2^(b-1)*127, T*2^(b+6)]; v fits 16 signed bits
//           for T <= 31 (b = 4) and T <= 15 (b = 5). We flush every 16 (b = 4) and 8 (b = 5) values.
#include <cuda_fp16.h>

#include "common/ampere.cuh"

typedef unsigned int u32;
typedef signed char s8;

template <bool B, class T, class F>
struct Cond { typedef T type; };
template <class T, class F>
struct Cond<false, T, F> { typedef F type; };

#define BK 128  // bytes (= int8 values of K) per pipeline stage

enum { FLAG_HALF = 1, FLAG_BIAS = 2, FLAG_GELU = 4 };

__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool pred) {
  int n = pred ? 16 : 0;  // src-size 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}

__device__ __forceinline__ void ldmatrix_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

__device__ __forceinline__ void mma_s8(int* c, const u32* a, const u32* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Byte offset of 16-byte chunk `c` of tile row `r` (rows of 128 bytes): XOR swizzle so that the 8 rows an
// ldmatrix (or 8 CUDA-core threads) read at one logical chunk fall in 8 different bank groups.
__device__ __forceinline__ int swz(int r, int c) { return r * BK + ((c ^ (r & 7)) << 4); }

// int8 byte `b` of word `v` -> exact fp32, without I2F: 2^23 + (byte ^ 0x80) - (2^23 + 128).
__device__ __forceinline__ float s8_to_f32(u32 vx /* v ^ 0x80808080 */, int b) {
  return __fsub_rn(__int_as_float(__byte_perm(vx, 0x4B000000u, 0x7650 + b)), 8388736.0f);
}
__device__ __forceinline__ int s8_at(u32 v, int b) { return (int)(s8)(v >> (8 * b)); }

// GELU. fp32 Y: 0.5 y (1 + erff(y / sqrt 2)). fp16 Y (round 8): gelu_h, y * Phi(y) from one ex2:
//   Phi(-t) = 2^(S(t') - t^2 log2(e) / 2),  t = |y|,  t' = min(t, 5.9),  Phi(y) = Phi(-t) if y < 0 else 1 - Phi(-t)
// S is a degree-7 fit of log2(Phi(-t)) + t^2 log2(e) / 2 on [0, 5.9] (tools/fit_gelu_poly.py: least squares
// reweighted toward minimax). Its relative error on Phi(-t) is below 4e-6, so there is no cancellation in the
// negative tail, where 1 + erff(y / sqrt 2) loses its digits (erff's absolute error ~6e-8 against 1 + erf ~ 6e-7
// at y = -5). Past 5.9, S(5.9) is kept and -t^2 carries the decay (|y| Phi(-t) < 2e-8 there: fp16 -0 for y < 0,
// y for y > 0); +-inf and NaN give what the erf form gives (inf, NaN, NaN). Checked on the CPU against float64 erf
// (tests/test_vitbit_gemm_gelu.py reads the coefficients from this file): the fp16 of the result is never more than
// 1 ulp from the correctly rounded GELU. 14 SASS instructions against 25 (and 7 constant loads) for the erff form.
__device__ __forceinline__ float gelu_erf(float y) { return 0.5f * y * (1.0f + erff(y * 0.70710678118654752f)); }

__device__ __forceinline__ float gelu_h(float y) {
  const float t = fminf(fabsf(y), 5.9f);  // GELU_H_CLAMP
  // GELU_H_COEFFS begin (S, highest degree first)
  float s = -1.832959469538764e-06f;
  s = fmaf(s, t, 6.156673043733463e-05f);
  s = fmaf(s, t, -0.0009303175029344857f);
  s = fmaf(s, t, 0.008507231250405312f);
  s = fmaf(s, t, -0.05395901948213577f);
  s = fmaf(s, t, 0.2628823518753052f);
  s = fmaf(s, t, -1.1512508392333984f);
  s = fmaf(s, t, -0.9999952912330627f);
  // GELU_H_COEFFS end
  const float p = fmaf(y * y, -0.72134752044448170f, s);  // - log2(e) / 2
  float q;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(q) : "f"(p));
  return y * (y < 0.f ? q : 1.0f - q);
}

// The GELU of a value headed for Y of this launch's type (fp16: gelu_h; fp32: the erff form).
__device__ __forceinline__ float gelu_y(float y, int flags) { return (flags & FLAG_HALF) ? gelu_h(y) : gelu_erf(y); }

// Epilogue for one output element; every step rounds exactly like numpy (reference module).
__device__ __forceinline__ float dequant(int acc, int col, const float* __restrict__ w_scale,
                                        const float* __restrict__ bias, float x_scale, int flags) {
  float alpha = __fmul_rn(x_scale, __ldg(w_scale + col));
  float y = __fmul_rn(__int2float_rn(acc), alpha);
  if (flags & FLAG_BIAS) y = __fadd_rn(y, __ldg(bias + col));
  if (flags & FLAG_GELU) y = gelu_y(y, flags);
  return y;
}

struct Out {
  void* y;
  int* partial;  // split-K: int32 partials [gridDim.z, M, N], no epilogue
  const float* w_scale;
  const float* bias;
  float x_scale;
  int flags, M, N;

  __device__ __forceinline__ void put(int row, int col, int acc) const {
    if (row >= M || col >= N) return;
    size_t i = (size_t)row * N + col;
    if (partial) {
      partial[(size_t)blockIdx.z * M * N + i] = acc;
    } else if (flags & FLAG_HALF) {
      reinterpret_cast<__half*>(y)[i] = __float2half_rn(dequant(acc, col, w_scale, bias, x_scale, flags));
    } else {
      reinterpret_cast<float*>(y)[i] = dequant(acc, col, w_scale, bias, x_scale, flags);
    }
  }
  // Per-column epilogue constants, loaded once per column by the tensor-core warps.
  __device__ __forceinline__ float2 colc(int col) const {
    if (partial || col >= N) return make_float2(0.f, 0.f);
    return make_float2(__fmul_rn(x_scale, __ldg(w_scale + col)), (flags & FLAG_BIAS) ? __ldg(bias + col) : 0.f);
  }
  __device__ __forceinline__ float deq(int acc, float2 cc) const {
    float y = __fmul_rn(__int2float_rn(acc), cc.x);
    if (flags & FLAG_BIAS) y = __fadd_rn(y, cc.y);
    if (flags & FLAG_GELU) y = gelu_y(y, flags);
    return y;
  }
  // Two adjacent columns (col even): one 4- or 8-byte store when both are in range and N is even.
  __device__ __forceinline__ void put2(int row, int col, int a0, int a1, float2 c0, float2 c1) const {
    if (row >= M) return;
    if (col + 1 < N && !(N & 1)) {
      size_t i = (size_t)row * N + col;
      if (partial) {
        *reinterpret_cast<int2*>(partial + (size_t)blockIdx.z * M * N + i) = make_int2(a0, a1);
      } else {
        float y0 = deq(a0, c0);
        float y1 = deq(a1, c1);
        if (flags & FLAG_HALF)
          *reinterpret_cast<__half2*>(reinterpret_cast<__half*>(y) + i) =
              __halves2half2(__float2half_rn(y0), __float2half_rn(y1));
        else
          *reinterpret_cast<float2*>(reinterpret_cast<float*>(y) + i) = make_float2(y0, y1);
      }
    } else {
      put(row, col, a0);
      put(row, col + 1, a1);
    }
  }
};

// ------------------------------------------------------------------------------------------------
// Activation quantization: X [M, K] (fp16/fp32) -> Xq int8 [M, Kp], pad columns 0.
// ------------------------------------------------------------------------------------------------
__device__ __forceinline__ int quant1(float x, float s) {
  float v = __fdiv_rn(x, s);
  int q = (v != v) ? 0 : __float2int_rn(v);  // NaN -> 0; +-inf saturate to INT_MAX/INT_MIN, then clip
  return min(127, max(-128, q));
}

template <typename T>
__device__ void quantize(const T* __restrict__ x, int* __restrict__ xq, float s, int M, int K, int Kp) {
  const int kq = Kp >> 2;
  const long total = (long)M * kq;
  for (long g = blockIdx.x * (long)blockDim.x + threadIdx.x; g < total; g += (long)gridDim.x * blockDim.x) {
    int row = (int)(g / kq), k = (int)(g % kq) * 4;
    const T* xr = x + (size_t)row * K;
    u32 packed = 0;
    if ((K & 3) == 0) {  // 4 aligned elements: one 8- or 16-byte load
      if (k < K) {
        float v[4];
        if (sizeof(T) == 2) {
          uint2 r = *reinterpret_cast<const uint2*>(xr + k);
          float2 lo = __half22float2(*reinterpret_cast<__half2*>(&r.x));
          float2 hi = __half22float2(*reinterpret_cast<__half2*>(&r.y));
          v[0] = lo.x; v[1] = lo.y; v[2] = hi.x; v[3] = hi.y;
        } else {
          float4 r = *reinterpret_cast<const float4*>(xr + k);
          v[0] = r.x; v[1] = r.y; v[2] = r.z; v[3] = r.w;
        }
#pragma unroll
        for (int e = 0; e < 4; e++) packed |= (u32)(quant1(v[e], s) & 0xFF) << (8 * e);
      }
    } else {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int q = (k + e < K) ? quant1((float)xr[k + e], s) : 0;
        packed |= (u32)(q & 0xFF) << (8 * e);
      }
    }
    xq[g] = (int)packed;
  }
}

// The quantize kernel, first of every launch, also zeroes the tile counters of the in-kernel split-K
// tactics (tk): nctr ints at xq + ctr_off (int words) in the workspace; nctr = 0 for every other tactic.
__device__ __forceinline__ void zero_counters(int* __restrict__ xq, long long ctr_off, int nctr) {
  if (blockIdx.x == 0)
    for (int i = threadIdx.x; i < nctr; i += blockDim.x) xq[ctr_off + i] = 0;
}
extern "C" __global__ void vitbit_quantize_f16(const __half* __restrict__ x, int* __restrict__ xq, float s,
                                               int M, int K, int Kp, long long ctr_off, int nctr) {
  zero_counters(xq, ctr_off, nctr);
  quantize<__half>(x, xq, s, M, K, Kp);
}
extern "C" __global__ void vitbit_quantize_f32(const float* __restrict__ x, int* __restrict__ xq, float s,
                                               int M, int K, int Kp, long long ctr_off, int nctr) {
  zero_counters(xq, ctr_off, nctr);
  quantize<float>(x, xq, s, M, K, Kp);
}

// Already quantized X (int8 input, the graph's QuantizeLinear output): the GEMM reads X itself when its rows
// are whole 16-byte chunks (K % 16 == 0, X 16-byte aligned). Otherwise this kernel copies X into Xq [M, Kp]
// (pad columns 0); with M = 0 it only zeroes the tk tile counters (the quantize kernel's other job).
extern "C" __global__ void vitbit_pad_i8(const s8* __restrict__ x, int* __restrict__ xq, int M, int K, int Kp,
                                         long long ctr_off, int nctr) {
  zero_counters(xq, ctr_off, nctr);
  const int kq = Kp >> 2;
  const long total = (long)M * kq;
  for (long g = blockIdx.x * (long)blockDim.x + threadIdx.x; g < total; g += (long)gridDim.x * blockDim.x) {
    const int row = (int)(g / kq), k = (int)(g % kq) * 4;
    const s8* xr = x + (size_t)row * K;
    u32 packed = 0;
#pragma unroll
    for (int e = 0; e < 4; e++)
      if (k + e < K) packed |= (u32)(unsigned char)xr[k + e] << (8 * e);
    xq[g] = (int)packed;
  }
}

// Split-K: sum the int32 partials (exact: the total is within the int32 bound) and apply the epilogue.
extern "C" __global__ void vitbit_splitk_epilogue(const int* __restrict__ partial, int splits, void* y,
                                                  const float* __restrict__ w_scale,
                                                  const float* __restrict__ bias, float x_scale, int flags,
                                                  int M, int N) {
  Out o{y, nullptr, w_scale, bias, x_scale, flags, M, N};
  const long total = (long)M * N;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
    int acc = 0;
    for (int z = 0; z < splits; z++) acc += partial[(size_t)z * total + i];
    o.put((int)(i / N), (int)(i % N), acc);
  }
}

// ------------------------------------------------------------------------------------------------
// The fused GEMM.
// ------------------------------------------------------------------------------------------------
template <int BM, int BN_TC, int WM, int WN, int STAGES, int BN_INT, int BN_FP, int TM, int INT_MODE>
struct Cfg {
  static constexpr int TN = 8;  // CUDA-core micro-tile: TM rows x TN columns per thread
  static constexpr int BN = BN_TC + BN_INT + BN_FP;
  static constexpr int TC_WARPS = (BM / WM) * (BN_TC / WN);
  static constexpr int INT_THREADS = BM * BN_INT / (TM * TN);
  static constexpr int FP_THREADS = BM * BN_FP / (TM * TN);
  static constexpr int THREADS = TC_WARPS * 32 + INT_THREADS + FP_THREADS;
  static constexpr int STAGE_BYTES = (BM + BN) * BK;
  static constexpr int SMEM = STAGES * STAGE_BYTES;
  static_assert(INT_THREADS % 32 == 0 && FP_THREADS % 32 == 0, "CUDA-core shares must fill whole warps");
  static_assert(WM % 16 == 0 && WN % 16 == 0 && BM % WM == 0 && BN_TC % WN == 0, "bad warp tile");
  static_assert(BN_INT % TN == 0 && BN_FP % TN == 0 && BM % TM == 0, "bad CUDA-core tile");
};

template <class C, int BM>
__device__ __forceinline__ void load_stage(unsigned char* st, const s8* __restrict__ A, const s8* __restrict__ W,
                                           int m0, int n0, int kt, int M, int N, int Kp) {
  constexpr int ROWS = BM + C::BN;
  const int kbyte0 = kt * BK;
  const u32 base = smem_u32(st);
  for (int i = threadIdx.x; i < ROWS * 8; i += C::THREADS) {
    int r = i >> 3, c = i & 7;
    int kb = kbyte0 + c * 16;
    const s8* src;
    bool ok;
    if (r < BM) {
      ok = (m0 + r < M) && (kb < Kp);
      src = ok ? A + (size_t)(m0 + r) * Kp + kb : A;
    } else {
      ok = (n0 + r - BM < N) && (kb < Kp);
      src = ok ? W + (size_t)(n0 + r - BM) * Kp + kb : W;
    }
    cp_async16(base + swz(r, c), src, ok);
  }
}

// Tensor-core role: warp tile WM x WN of the first BN_TC columns.
template <int BM, int WM, int WN>
struct TcRole {
  static constexpr int MI = WM / 16, NI = WN / 8;
  int acc[MI][NI][4];

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
      for (int j = 0; j < NI; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[i][j][e] = 0;
  }

  // The ldmatrix addresses, one swizzle each (swz): the tc2, tk and hybrid kernels. In the persistent ones
  // (tp) ptxas recomputed them at every k-tile; those take compute(st, Off) below (round 9).
  __device__ __forceinline__ void compute(const unsigned char* st, int wm0, int wn0, int lane) {
    const u32 base = smem_u32(st);
#pragma unroll
    for (int ks = 0; ks < BK / 32; ks++) {
      u32 a[MI][4], b[NI][2];
#pragma unroll
      for (int i = 0; i < MI; i++) {
        int r = wm0 + i * 16 + (lane & 15);
        ldmatrix_x4(base + swz(r, ks * 2 + (lane >> 4)), a[i][0], a[i][1], a[i][2], a[i][3]);
      }
#pragma unroll
      for (int j = 0; j < NI; j += 2) {
        int r = BM + wn0 + j * 8 + (lane & 7) + ((lane >> 4) << 3);
        ldmatrix_x4(base + swz(r, ks * 2 + ((lane >> 3) & 1)), b[j][0], b[j][1], b[j + 1][0], b[j + 1][1]);
      }
#pragma unroll
      for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++) mma_s8(acc[i][j], a[i], b[j]);
    }
  }

  // The same from two lane offsets (round 9, for the persistent kernels). Every row these ldmatrix read has
  // r & 7 == lane & 7, and chunk ks * 2 + h (h one bit), so swz(r, ks * 2 + h) = (swz(r0, h) ^ (ks << 5)) +
  // (r - r0) * BK with r0 the i = 0 (j = 0) row: the k-step is an XOR on bits 5-6, the fragment an immediate.
  // With the stage base 128-byte aligned (bits 0-6 zero) the XOR commutes with adding it: one LOP3 per
  // operand and k-step. The offsets come from offsets(), once per kernel, through an identity shuffle:
  // otherwise ptxas recomputes them from the thread index at every k-tile (~25 instructions in tp_32x32).
  struct Off {
    u32 a, b;
  };
  static __device__ __forceinline__ Off offsets(int wm0, int wn0, int lane) {
    static_assert(BK == 128, "the XOR form assumes 8 chunks of 16 bytes per row");
    const u32 a = swz(wm0 + (lane & 15), lane >> 4), b = swz(BM + wn0 + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
    return Off{__shfl_sync(0xffffffffu, a, lane), __shfl_sync(0xffffffffu, b, lane)};
  }
  __device__ __forceinline__ void compute(const unsigned char* st, Off off) {
    const u32 base = smem_u32(st);
    const u32 pa = base + off.a, pb = base + off.b;
#pragma unroll
    for (int ks = 0; ks < BK / 32; ks++) {
      u32 a[MI][4], b[NI][2];
      const u32 qa = pa ^ (ks << 5), qb = pb ^ (ks << 5);
#pragma unroll
      for (int i = 0; i < MI; i++) ldmatrix_x4(qa + i * 16 * BK, a[i][0], a[i][1], a[i][2], a[i][3]);
#pragma unroll
      for (int j = 0; j < NI; j += 2) ldmatrix_x4(qb + j * 8 * BK, b[j][0], b[j][1], b[j + 1][0], b[j + 1][1]);
#pragma unroll
      for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++) mma_s8(acc[i][j], a[i], b[j]);
    }
  }

  __device__ __forceinline__ void store(const Out& o, int m0, int n0, int wm0, int wn0, int lane) const {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < NI; j++) {
      const int col = n0 + wn0 + j * 8 + t * 2;
      const float2 c0 = o.colc(col), c1 = o.colc(col + 1);
#pragma unroll
      for (int i = 0; i < MI; i++) {
        int row = m0 + wm0 + i * 16 + g;
        o.put2(row, col, acc[i][j][0], acc[i][j][1], c0, c1);
        o.put2(row + 8, col, acc[i][j][2], acc[i][j][3], c0, c1);
      }
    }
  }
};

// CUDA-core roles: thread micro-tile TM x TN; rows rg + i * RG, columns c0 + cg + j * CG of the tile.
template <int BM, int BN_X, int TM>
struct CcMap {
  static constexpr int TN = 8, RG = BM / TM, CG = BN_X / TN;
  int rg, cg;
  __device__ __forceinline__ CcMap(int t) : rg(t % RG), cg(t / RG) {}
};

// INT_MODE 0: dp4a.
template <int BM, int BN_X, int TM>
struct Dp4aRole {
  static constexpr int TN = 8;
  int acc[TM][TN];
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
      for (int j = 0; j < TN; j++) acc[i][j] = 0;
  }
  __device__ __forceinline__ void compute(const unsigned char* st, const CcMap<BM, BN_X, TM>& mp, int wrow0) {
#pragma unroll 2
    for (int c = 0; c < 8; c++) {
      uint4 a[TM];
#pragma unroll
      for (int i = 0; i < TM; i++) {
        int r = mp.rg + i * mp.RG;
        a[i] = *reinterpret_cast<const uint4*>(st + swz(r, c));
      }
#pragma unroll
      for (int j = 0; j < TN; j++) {
        int r = BM + wrow0 + mp.cg + j * mp.CG;
        uint4 w = *reinterpret_cast<const uint4*>(st + swz(r, c));
#pragma unroll
        for (int i = 0; i < TM; i++) {
          acc[i][j] = __dp4a((int)a[i].x, (int)w.x, acc[i][j]);
          acc[i][j] = __dp4a((int)a[i].y, (int)w.y, acc[i][j]);
          acc[i][j] = __dp4a((int)a[i].z, (int)w.z, acc[i][j]);
          acc[i][j] = __dp4a((int)a[i].w, (int)w.w, acc[i][j]);
        }
      }
    }
  }
  __device__ __forceinline__ void flush() {}
};

// INT_MODE 4/5: two 16-bit fields per register, P = w[c0] + 2^16 w[c1] (columns cg + 2p*CG, cg + (2p+1)*CG).
template <int BM, int BN_X, int TM, int BITS>
struct FieldRole {
  static constexpr int TN = 8, TP = TN / 2;
  static constexpr int FLUSH = BITS == 4 ? 16 : 8;  // <= the proven bound (31 for 4-bit, 15 for 5-bit)
  int acc[TM][TN];
  u32 f[TM][TP];
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < TM; i++) {
#pragma unroll
      for (int j = 0; j < TN; j++) acc[i][j] = 0;
#pragma unroll
      for (int p = 0; p < TP; p++) f[i][p] = 0u;
    }
  }
  __device__ __forceinline__ void extract() {
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
      for (int p = 0; p < TP; p++) {
        int v0 = (int)(short)(f[i][p] & 0xFFFFu);
        int v1 = ((int)(f[i][p] - (u32)v0)) >> 16;
        acc[i][2 * p] += v0;
        acc[i][2 * p + 1] += v1;
        f[i][p] = 0u;
      }
  }
  __device__ __forceinline__ void compute(const unsigned char* st, const CcMap<BM, BN_X, TM>& mp, int wrow0) {
#pragma unroll 1
    for (int c = 0; c < 8; c++) {
#pragma unroll
      for (int q4 = 0; q4 < 4; q4++) {  // one 32-bit word = 4 values of K per row
        u32 a[TM], w[TN];
#pragma unroll
        for (int i = 0; i < TM; i++) a[i] = *reinterpret_cast<const u32*>(st + swz(mp.rg + i * mp.RG, c) + 4 * q4);
#pragma unroll
        for (int j = 0; j < TN; j++)
          w[j] = *reinterpret_cast<const u32*>(st + swz(BM + wrow0 + mp.cg + j * mp.CG, c) + 4 * q4);
#pragma unroll
        for (int b = 0; b < 4; b++) {
          u32 P[TP];
#pragma unroll
          for (int p = 0; p < TP; p++) P[p] = (u32)s8_at(w[2 * p], b) + ((u32)s8_at(w[2 * p + 1], b) << 16);
#pragma unroll
          for (int i = 0; i < TM; i++) {
            u32 q = (u32)s8_at(a[i], b);
#pragma unroll
            for (int p = 0; p < TP; p++) f[i][p] += q * P[p];  // mod 2^32; fields exact within the bound
          }
          if ((q4 * 4 + b + 1) % FLUSH == 0) extract();
        }
      }
    }
  }
  __device__ __forceinline__ void flush() {}
};

// FP role: int8 -> fp32, FFMA; flushed into int32 every 8 k-tiles (1024 values of K, the fp32 bound).
template <int BM, int BN_X, int TM>
struct FpRole {
  static constexpr int TN = 8;
  int acc[TM][TN];
  float f[TM][TN];
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
      for (int j = 0; j < TN; j++) { acc[i][j] = 0; f[i][j] = 0.0f; }
  }
  __device__ __forceinline__ void flush() {
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
      for (int j = 0; j < TN; j++) { acc[i][j] += __float2int_rn(f[i][j]); f[i][j] = 0.0f; }
  }
  __device__ __forceinline__ void compute(const unsigned char* st, const CcMap<BM, BN_X, TM>& mp, int wrow0) {
#pragma unroll 1
    for (int c = 0; c < 8; c++) {
#pragma unroll
      for (int q4 = 0; q4 < 4; q4++) {  // one 32-bit word = 4 values of K per row
        u32 a[TM], w[TN];
#pragma unroll
        for (int i = 0; i < TM; i++)
          a[i] = *reinterpret_cast<const u32*>(st + swz(mp.rg + i * mp.RG, c) + 4 * q4) ^ 0x80808080u;
#pragma unroll
        for (int j = 0; j < TN; j++)
          w[j] = *reinterpret_cast<const u32*>(st + swz(BM + wrow0 + mp.cg + j * mp.CG, c) + 4 * q4) ^ 0x80808080u;
#pragma unroll
        for (int b = 0; b < 4; b++) {
          float av[TM], wv[TN];
#pragma unroll
          for (int i = 0; i < TM; i++) av[i] = s8_to_f32(a[i], b);
#pragma unroll
          for (int j = 0; j < TN; j++) wv[j] = s8_to_f32(w[j], b);
#pragma unroll
          for (int i = 0; i < TM; i++)
#pragma unroll
            for (int j = 0; j < TN; j++) f[i][j] = __fmaf_rn(av[i], wv[j], f[i][j]);  // exact (see header)
        }
      }
    }
  }
};

template <int BM, int BN_X, int TM, class Role>
__device__ __forceinline__ void cc_store(const Role& role, const CcMap<BM, BN_X, TM>& mp, const Out& o, int m0,
                                         int n0, int wrow0) {
#pragma unroll
  for (int i = 0; i < TM; i++)
#pragma unroll
    for (int j = 0; j < 8; j++) o.put(m0 + mp.rg + i * mp.RG, n0 + wrow0 + mp.cg + j * mp.CG, role.acc[i][j]);
}

// The cp.async multistage main loop, run by every warp of the block; `compute(stage, t)` is the role's work
// on k-tile t. Each role runs its own copy (so only its own accumulators are live); all copies execute the
// same number of block barriers, so the barriers match.
template <class C, int BM, int STAGES, class F>
__device__ __forceinline__ void pipeline(unsigned char* smem, const s8* __restrict__ A, const s8* __restrict__ W,
                                         int m0, int n0, int kt0, int nkt, int M, int N, int Kp, F&& compute) {
#pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    if (s < nkt) load_stage<C, BM>(smem + s * C::STAGE_BYTES, A, W, m0, n0, kt0 + s, M, N, Kp);
    cp_async_commit();
  }
#pragma unroll 1
  for (int t = 0; t < nkt; t++) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    int nx = t + STAGES - 1;
    if (nx < nkt) load_stage<C, BM>(smem + (nx % STAGES) * C::STAGE_BYTES, A, W, m0, n0, kt0 + nx, M, N, Kp);
    cp_async_commit();
    compute(smem + (t % STAGES) * C::STAGE_BYTES, t);
  }
  cp_async_wait<0>();
}

template <int BM, int BN_TC, int WM, int WN, int STAGES, int BN_INT, int BN_FP, int TM, int INT_MODE>
__device__ __forceinline__ void gemm_body(const s8* __restrict__ A, const s8* __restrict__ W, Out o, int Kp,
                                          int kt_per_split) {
  typedef Cfg<BM, BN_TC, WM, WN, STAGES, BN_INT, BN_FP, TM, INT_MODE> C;
  extern __shared__ __align__(128) unsigned char smem[];
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * C::BN;
  const int KT = (Kp + BK - 1) / BK;
  const int kt0 = blockIdx.z * kt_per_split;
  const int nkt = max(0, min(KT, kt0 + kt_per_split) - kt0);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  if (warp < C::TC_WARPS) {  // tensor-core warps
    const int wm0 = (warp % (BM / WM)) * WM, wn0 = (warp / (BM / WM)) * WN;
    TcRole<BM, WM, WN> tc;
    tc.zero();
    pipeline<C, BM, STAGES>(smem, A, W, m0, n0, kt0, nkt, o.M, o.N, Kp,
                            [&](const unsigned char* st, int) { tc.compute(st, wm0, wn0, lane); });
    tc.store(o, m0, n0, wm0, wn0, lane);
  } else if (BN_INT > 0 && threadIdx.x < C::TC_WARPS * 32 + C::INT_THREADS) {  // INT-core warps
    constexpr int BI = BN_INT > 0 ? BN_INT : 8;
    typedef typename Cond<INT_MODE == 0, Dp4aRole<BM, BI, TM>, FieldRole<BM, BI, TM, INT_MODE>>::type IntRole;
    const CcMap<BM, BI, TM> mp(threadIdx.x - C::TC_WARPS * 32);
    IntRole ir;
    ir.zero();
    pipeline<C, BM, STAGES>(smem, A, W, m0, n0, kt0, nkt, o.M, o.N, Kp,
                            [&](const unsigned char* st, int) { ir.compute(st, mp, BN_TC); });
    cc_store<BM, BI, TM>(ir, mp, o, m0, n0, BN_TC);
  } else if (BN_FP > 0) {  // FP-core warps
    constexpr int BF = BN_FP > 0 ? BN_FP : 8;
    const CcMap<BM, BF, TM> mp(threadIdx.x - C::TC_WARPS * 32 - C::INT_THREADS);
    FpRole<BM, BF, TM> fr;
    fr.zero();
    pipeline<C, BM, STAGES>(smem, A, W, m0, n0, kt0, nkt, o.M, o.N, Kp, [&](const unsigned char* st, int t) {
      fr.compute(st, mp, BN_TC + BN_INT);
      if ((t & 7) == 7) fr.flush();  // every 8 k-tiles = 1024 values of K: the fp32 exactness bound
    });
    fr.flush();
    cc_store<BM, BF, TM>(fr, mp, o, m0, n0, BN_TC + BN_INT);
  }
}

// name, BM, BN_TC, WM, WN, STAGES, BN_INT, BN_FP, TM, INT_MODE, min blocks per SM (register cap)
#define VITBIT_GEMM(NAME, BM, BN_TC, WM, WN, ST, BNI, BNF, TM, MODE, MINB)                                     \
  extern "C" __global__ void __launch_bounds__(Cfg<BM, BN_TC, WM, WN, ST, BNI, BNF, TM, MODE>::THREADS, MINB)    \
      vitbit_gemm_##NAME(const s8* __restrict__ A, const s8* __restrict__ W, void* y, int* partial,           \
                         const float* __restrict__ w_scale, const float* __restrict__ bias, float x_scale,     \
                         int flags, int M, int N, int Kp, int kt_per_split) {                                  \
    Out o{y, partial, w_scale, bias, x_scale, flags, M, N};                                                    \
    gemm_body<BM, BN_TC, WM, WN, ST, BNI, BNF, TM, MODE>(A, W, o, Kp, kt_per_split);                           \
  }

// Hybrids on the 128-row tile: tensor cores 96 columns (m = 3) or 128 (m = 4, the paper's), CUDA cores 32.
VITBIT_GEMM(h128_tc96_i32, 128, 96, 64, 32, 3, 32, 0, 4, 0, 1)
VITBIT_GEMM(h128_tc96_i16_f16, 128, 96, 64, 32, 3, 16, 16, 4, 0, 1)
VITBIT_GEMM(h128_tc96_f32, 128, 96, 64, 32, 3, 0, 32, 4, 0, 1)
VITBIT_GEMM(h128_tc128_i32, 128, 128, 64, 32, 3, 32, 0, 4, 0, 1)
// Small CUDA-core shares (~6 % of the columns: about what dp4a/FFMA issue rates can add beside mma.sync).
VITBIT_GEMM(h128_tc128_i8, 128, 128, 64, 32, 3, 8, 0, 4, 0, 1)
VITBIT_GEMM(h128_tc128_i8_f8, 128, 128, 64, 32, 3, 8, 8, 2, 0, 1)
VITBIT_GEMM(h64_tc64_i8, 64, 64, 32, 32, 4, 8, 0, 2, 0, 2)
VITBIT_GEMM(h64_tc128_i8, 64, 128, 32, 32, 4, 8, 0, 2, 0, 2)
// Hybrids on the 64-row tile: tensor cores 64 columns, CUDA cores 16.
VITBIT_GEMM(h64_tc64_i16, 64, 64, 32, 32, 4, 16, 0, 4, 0, 2)
VITBIT_GEMM(h64_tc64_i8_f8, 64, 64, 32, 32, 4, 8, 8, 2, 0, 2)
// Packed 16-bit fields for 4- and 5-bit weights on the INT share.
VITBIT_GEMM(h128_tc96_i32_field4, 128, 96, 64, 32, 3, 32, 0, 4, 4, 1)
VITBIT_GEMM(h128_tc96_i32_field5, 128, 96, 64, 32, 3, 32, 0, 4, 5, 1)
VITBIT_GEMM(h64_tc64_i16_field4, 64, 64, 32, 32, 4, 16, 0, 4, 4, 2)
VITBIT_GEMM(h64_tc64_i16_field5, 64, 64, 32, 32, 4, 16, 0, 4, 5, 2)

// ------------------------------------------------------------------------------------------------
// Tensor-core-only GEMM, second generation ("tc2"): same math and pipeline as the TC role above, with
//  * cp.async addresses computed once per thread: every thread copies the same 16-byte chunk column of
//    a fixed set of rows, so a stage costs one pointer add per copy; rows past M (or N) are clamped to
//    the last row instead of predicated off: they only feed output rows (columns) that are never
//    stored. Only the K tail is zero-filled (src-size 0), as before;
//  * the epilogue staged through shared memory (int32 tile, padded rows: conflict-free 8-byte writes
//    and 16-byte reads), then each thread finishes 8 consecutive columns of one row: 16-byte fp16
//    stores (2 x 16 B fp32, 2 x 16 B int32 partials), per-column constants loaded once per chunk.
//    The epilogue code is one small loop instead of 64 inlined element stores per thread.
// ------------------------------------------------------------------------------------------------
template <int BM, int BN, int WM, int WN, int STAGES>
struct Tc2Cfg {
  static constexpr int WARPS = (BM / WM) * (BN / WN);
  static constexpr int THREADS = WARPS * 32;
  static constexpr int STAGE_BYTES = (BM + BN) * BK;
  static constexpr int RSTEP = THREADS / 8;  // tile rows one copy step covers (8 chunks of 16 B per row)
  static constexpr int LA = BM / RSTEP, LW = BN / RSTEP;
  static constexpr int CSTRIDE = BN + 8;  // 32-bit words per staged epilogue row (+8: no bank conflicts)
  static constexpr int EPI_BYTES = BM * CSTRIDE * 4;
  static constexpr int SMEM = STAGES * STAGE_BYTES > EPI_BYTES ? STAGES * STAGE_BYTES : EPI_BYTES;
  static_assert(BM % RSTEP == 0 && BN % RSTEP == 0 && RSTEP % 8 == 0, "copy mapping");
  static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 16 == 0, "warp tile");
  static_assert((BM * BN / 8) % THREADS == 0, "epilogue mapping");
};

// Stores y[0..7] to Y at element i = row * N + col (fp16 or fp32 by FLAG_HALF): one 16-byte store (two for fp32)
// where the 8 columns are inside N and Y is aligned, else one element at a time up to N.
__device__ __forceinline__ void store8(const Out& o, size_t i, int col, bool full, const float (&y)[8]) {
  const int N = o.N;
  if (o.flags & FLAG_HALF) {
    __half* p = reinterpret_cast<__half*>(o.y) + i;
    if (full && !(N & 7) && !(reinterpret_cast<size_t>(o.y) & 15)) {
      uint4 u;
      __half2 h0 = __halves2half2(__float2half_rn(y[0]), __float2half_rn(y[1]));
      __half2 h1 = __halves2half2(__float2half_rn(y[2]), __float2half_rn(y[3]));
      __half2 h2 = __halves2half2(__float2half_rn(y[4]), __float2half_rn(y[5]));
      __half2 h3 = __halves2half2(__float2half_rn(y[6]), __float2half_rn(y[7]));
      u.x = *reinterpret_cast<u32*>(&h0);
      u.y = *reinterpret_cast<u32*>(&h1);
      u.z = *reinterpret_cast<u32*>(&h2);
      u.w = *reinterpret_cast<u32*>(&h3);
      *reinterpret_cast<uint4*>(p) = u;
    } else {
#pragma unroll
      for (int e = 0; e < 8; e++)
        if (col + e < N) p[e] = __float2half_rn(y[e]);
    }
  } else {
    float* p = reinterpret_cast<float*>(o.y) + i;
    if (full && !(N & 3) && !(reinterpret_cast<size_t>(o.y) & 15)) {
      reinterpret_cast<float4*>(p)[0] = make_float4(y[0], y[1], y[2], y[3]);
      reinterpret_cast<float4*>(p)[1] = make_float4(y[4], y[5], y[6], y[7]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; e++)
        if (col + e < N) p[e] = y[e];
    }
  }
}

// The epilogue of 8 consecutive columns col..col+7 of one row (v: exact int32 sums).
__device__ __forceinline__ void put8(const Out& o, int row, int col, const int* v) {
  const int M = o.M, N = o.N;
  const size_t i = (size_t)row * N + col;
  const bool full = col + 8 <= N;
  if (o.partial) {
    int* p = o.partial + (size_t)blockIdx.z * M * N + i;
    if (full && !(N & 3) && !(reinterpret_cast<size_t>(o.partial) & 15)) {
      reinterpret_cast<int4*>(p)[0] = make_int4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<int4*>(p)[1] = make_int4(v[4], v[5], v[6], v[7]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; e++)
        if (col + e < N) p[e] = v[e];
    }
    return;
  }
  float y[8];
#pragma unroll
  for (int e = 0; e < 8; e++) {
    const int c = min(col + e, N - 1);  // columns past N are computed on a valid index, never stored
    float alpha = __fmul_rn(o.x_scale, __ldg(o.w_scale + c));
    float t = __fmul_rn(__int2float_rn(v[e]), alpha);
    if (o.flags & FLAG_BIAS) t = __fadd_rn(t, __ldg(o.bias + c));
    y[e] = t;
  }
  if (o.flags & FLAG_GELU) {
#pragma unroll
    for (int e = 0; e < 8; e++) y[e] = gelu_y(y[e], o.flags);
  }
  store8(o, i, col, full, y);
}

// The tc2 main loop: k-tiles kt0 .. kt0 + nkt - 1 of the block tile at (m0, n0), accumulated into tc.
// Copy mapping: chunk column c of rows r0 + j * RSTEP (A rows, then W rows after BM).
template <int BM, int BN, int WM, int WN, int STAGES>
__device__ __forceinline__ void tc2_mainloop(const s8* __restrict__ A, const s8* __restrict__ W, int M, int N,
                                             int Kp, int m0, int n0, int kt0, int nkt, unsigned char* smem,
                                             TcRole<BM, WM, WN>& tc, int wm0, int wn0, int lane) {
  typedef Tc2Cfg<BM, BN, WM, WN, STAGES> C;
  const int c = threadIdx.x & 7, r0 = threadIdx.x >> 3;
  const u32 dst0 = smem_u32(smem) + r0 * BK + ((c ^ (r0 & 7)) << 4);
  const s8* ga[C::LA];
  const s8* gw[C::LW];
#pragma unroll
  for (int j = 0; j < C::LA; j++) ga[j] = A + (size_t)min(m0 + r0 + j * C::RSTEP, M - 1) * Kp + c * 16;
#pragma unroll
  for (int j = 0; j < C::LW; j++) gw[j] = W + (size_t)min(n0 + r0 + j * C::RSTEP, N - 1) * Kp + c * 16;

  auto load = [&](int s, int kt) {
    const u32 dst = dst0 + s * C::STAGE_BYTES;
    const int kb = kt * BK;
    const bool ok = kb + c * 16 < Kp;  // K tail: zero-fill
#pragma unroll
    for (int j = 0; j < C::LA; j++) cp_async16(dst + j * C::RSTEP * BK, ok ? ga[j] + kb : A, ok);
#pragma unroll
    for (int j = 0; j < C::LW; j++) cp_async16(dst + (BM + j * C::RSTEP) * BK, ok ? gw[j] + kb : W, ok);
  };

#pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    if (s < nkt) load(s, kt0 + s);
    cp_async_commit();
  }
#pragma unroll 1
  for (int t = 0; t < nkt; t++) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int nx = t + STAGES - 1;
    if (nx < nkt) load(nx % STAGES, kt0 + nx);
    cp_async_commit();
    tc.compute(smem + (t % STAGES) * C::STAGE_BYTES, wm0, wn0, lane);
  }
  cp_async_wait<0>();
}

template <int BM, int BN, int WM, int WN, int STAGES>
__device__ __forceinline__ void tc2_body(const s8* __restrict__ A, const s8* __restrict__ W, const Out& o,
                                         int Kp, int kt_per_split) {
  typedef Tc2Cfg<BM, BN, WM, WN, STAGES> C;
  extern __shared__ __align__(128) unsigned char smem[];
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int KT = (Kp + BK - 1) / BK;
  const int kt0 = blockIdx.z * kt_per_split;
  const int nkt = max(0, min(KT, kt0 + kt_per_split) - kt0);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int M = o.M, N = o.N;
  const int wm0 = (warp % (BM / WM)) * WM, wn0 = (warp / (BM / WM)) * WN;
  TcRole<BM, WM, WN> tc;
  tc.zero();
  tc2_mainloop<BM, BN, WM, WN, STAGES>(A, W, M, N, Kp, m0, n0, kt0, nkt, smem, tc, wm0, wn0, lane);

  __syncthreads();  // every warp is done with the stages: reuse them for the epilogue tile

  int* cs = reinterpret_cast<int*>(smem);
  {
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int i = 0; i < TcRole<BM, WM, WN>::MI; i++)
#pragma unroll
      for (int j = 0; j < TcRole<BM, WM, WN>::NI; j++) {
        int* p = cs + (wm0 + i * 16 + g) * C::CSTRIDE + wn0 + j * 8 + t4 * 2;
        *reinterpret_cast<int2*>(p) = make_int2(tc.acc[i][j][0], tc.acc[i][j][1]);
        *reinterpret_cast<int2*>(p + 8 * C::CSTRIDE) = make_int2(tc.acc[i][j][2], tc.acc[i][j][3]);
      }
  }
  __syncthreads();
  constexpr int CPR = BN / 8;  // 8-column chunks per row
  // Lanes 4-7 of each quarter warp read the high half of their chunk first: the 8 lanes of a
  // 16-byte access then cover 32 distinct banks.
  const int h = (lane >> 2) & 1;
#pragma unroll 1
  for (int idx = threadIdx.x; idx < BM * CPR; idx += C::THREADS) {
    const int r = idx / CPR, cc = (idx % CPR) * 8;
    const int row = m0 + r, col = n0 + cc;
    const int* p = cs + r * C::CSTRIDE + cc;
    int4 u0 = *reinterpret_cast<const int4*>(p + 4 * h);
    int4 u1 = *reinterpret_cast<const int4*>(p + 4 - 4 * h);
    if (row >= M || col >= N) continue;
    int4 lo = h ? u1 : u0, hi = h ? u0 : u1;
    int v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    put8(o, row, col, v);
  }
}

// name, BM, BN, WM, WN, STAGES, min blocks per SM
#define VITBIT_TC2(NAME, BM, BN, WM, WN, ST, MINB)                                                            \
  extern "C" __global__ void __launch_bounds__(Tc2Cfg<BM, BN, WM, WN, ST>::THREADS, MINB)                      \
      vitbit_gemm_##NAME(const s8* __restrict__ A, const s8* __restrict__ W, void* y, int* partial,           \
                         const float* __restrict__ w_scale, const float* __restrict__ bias, float x_scale,     \
                         int flags, int M, int N, int Kp, int kt_per_split) {                                  \
    Out o{y, partial, w_scale, bias, x_scale, flags, M, N};                                                    \
    tc2_body<BM, BN, WM, WN, ST>(A, W, o, Kp, kt_per_split);                                                   \
  }

VITBIT_TC2(tc2_256x128, 256, 128, 64, 64, 3, 1)      // 8 warps of 64x64
VITBIT_TC2(tc2_64x128s3, 64, 128, 64, 32, 3, 3)      // 3 stages: 3 blocks per SM
VITBIT_TC2(tc2_64x64, 64, 64, 32, 32, 4, 3)          // 4 warps of 32x32
VITBIT_TC2(tc2_64x64s3, 64, 64, 32, 32, 3, 4)        // 3 stages: 4 blocks per SM
VITBIT_TC2(tc2_64x64s6, 64, 64, 32, 32, 6, 2)        // 6 stages: all of K = 768 in flight at once (small M)
VITBIT_TC2(tc2_32x64, 32, 64, 16, 32, 4, 4)          // 4 warps of 16x32, 48 KB (small M: more, shorter tiles)

// Split-K epilogue, 8 consecutive columns per thread (N % 8 == 0): 16-byte loads of the partials, exact
// int32 sum, then the same put8 as the tc2 kernels.
extern "C" __global__ void vitbit_splitk_epilogue8(const int* __restrict__ partial, int splits, void* y,
                                                   const float* __restrict__ w_scale,
                                                   const float* __restrict__ bias, float x_scale, int flags,
                                                   int M, int N) {
  Out o{y, nullptr, w_scale, bias, x_scale, flags, M, N};
  const long total = (long)M * N, chunks = total >> 3;
  const bool vec = !(reinterpret_cast<size_t>(partial) & 15);
  for (long g = blockIdx.x * (long)blockDim.x + threadIdx.x; g < chunks; g += (long)gridDim.x * blockDim.x) {
    const long i = g << 3;
    int v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int z = 0; z < splits; z++) {
      const int* p = partial + (size_t)z * total + i;
      if (vec) {
        int4 a = __ldg(reinterpret_cast<const int4*>(p)), b = __ldg(reinterpret_cast<const int4*>(p) + 1);
        v[0] += a.x; v[1] += a.y; v[2] += a.z; v[3] += a.w;
        v[4] += b.x; v[5] += b.y; v[6] += b.z; v[7] += b.w;
      } else {
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] += p[e];
      }
    }
    put8(o, (int)(i / N), (int)(i % N), v);
  }
}

// ------------------------------------------------------------------------------------------------
// Tensor-core-only GEMM, persistent ("tp"): the same warp tiles and mma.sync / ldmatrix / cp.async
// main loop as tc2, but each block is resident for the whole GEMM and walks the output tiles
// blockIdx.x, blockIdx.x + gridDim.x, ... (grid = min(tiles, blocks resident on the context's SMs)).
// The K loop of all its tiles is ONE pipelined sequence of (tile, k-tile) steps: the cp.async copies of
// the next tile's first k-tiles are in flight while the current tile finishes its last k-tiles and its
// epilogue, so the pipeline is filled once per block instead of once per tile (K = 768 is only 6
// k-tiles: the per-tile fill and epilogue were ~1/3 of the tc2 kernels' time).
// The epilogue works from registers (no shared memory, so the stages stay in use): the four lanes of a
// quad hold columns {j*8 + 2t, +1}, j = 0..3, of one row; a 4 x 4 transpose of column pairs inside the
// quad (two shfl.xor butterflies) gives lane t the 8 consecutive columns t*8..t*8+7, which it finishes
// with the same IEEE fp32 steps as put8 and one 16-byte fp16 store (two 16-byte fp32 stores).
// No split-K (the launcher uses one split); exactness is that of the int32 mma.sync sums, as in tc2.
// ------------------------------------------------------------------------------------------------

__device__ __forceinline__ u32 shfl_xor(u32 v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ int2 shfl_xor(int2 v, int m) {
  return make_int2(__shfl_xor_sync(0xffffffffu, v.x, m), __shfl_xor_sync(0xffffffffu, v.y, m));
}

// Select-free-index helpers: p[j] of a 4-entry array with a runtime lane bit (compiles to SEL, no local memory).
// T = int2 (column pairs of int32 sums) or u32 (column pairs already rounded to fp16).
template <class T>
__device__ __forceinline__ void quad_transpose(T (&p)[4], int t) {
  const bool b1 = (t >> 1) & 1, b0 = t & 1;
#pragma unroll
  for (int jj = 0; jj < 2; jj++) {  // swap the off-diagonal 2 x 2 blocks with lane t ^ 2
    const T r = shfl_xor(b1 ? p[jj] : p[jj + 2], 2);
    if (b1) p[jj] = r; else p[jj + 2] = r;
  }
#pragma unroll
  for (int jj = 0; jj < 4; jj += 2) {  // transpose each 2 x 2 block with lane t ^ 1
    const T r = shfl_xor(b0 ? p[jj] : p[jj + 1], 1);
    if (b0) p[jj] = r; else p[jj + 1] = r;
  }
}

// 8 consecutive columns col..col+7 of one row with per-column alpha / bias already loaded. G = false: a kernel
// for layers without GELU (no GELU code at all).
template <bool G>
__device__ __forceinline__ void put8c(const Out& o, int row, int col, const int2 (&q)[4], const float* alpha,
                                      const float* bias) {
  const int N = o.N;
  const size_t i = (size_t)row * N + col;
  const bool full = col + 8 <= N;
  const int v[8] = {q[0].x, q[0].y, q[1].x, q[1].y, q[2].x, q[2].y, q[3].x, q[3].y};
  float y[8];
#pragma unroll
  for (int e = 0; e < 8; e++) {
    float t = __fmul_rn(__int2float_rn(v[e]), alpha[e]);
    if (o.flags & FLAG_BIAS) t = __fadd_rn(t, bias[e]);
    y[e] = t;
  }
  if (G && (o.flags & FLAG_GELU)) {
#pragma unroll
    for (int e = 0; e < 8; e++) y[e] = gelu_y(y[e], o.flags);
  }
  store8(o, i, col, full, y);
}

// Epilogue of a warp tile from the mma fragments (no shared memory): quad transpose to 8 consecutive
// columns per lane, per-column alpha / bias loaded once per 32-column group, put8c.
template <bool G, class R>
__device__ __forceinline__ void regs_epilogue(const Out& o, const R& tc, int m0, int n0, int wm0, int wn0,
                                              int lane) {
  static_assert(R::NI % 4 == 0, "the quad transpose needs groups of 4 n8 blocks (WN % 32 == 0)");
  const int M = o.M, N = o.N;
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int jg = 0; jg < R::NI / 4; jg++) {
    const int col = n0 + wn0 + jg * 32 + t4 * 8;
    float alpha[8], bias[8];
#pragma unroll
    for (int e = 0; e < 8; e++) {
      const int cc = min(col + e, N - 1);  // columns past N are computed on a valid index, never stored
      alpha[e] = __fmul_rn(o.x_scale, __ldg(o.w_scale + cc));
      bias[e] = (o.flags & FLAG_BIAS) ? __ldg(o.bias + cc) : 0.f;
    }
#pragma unroll
    for (int i = 0; i < R::MI; i++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        int2 q[4];
#pragma unroll
        for (int j = 0; j < 4; j++) q[j] = make_int2(tc.acc[i][jg * 4 + j][2 * h], tc.acc[i][jg * 4 + j][2 * h + 1]);
        quad_transpose(q, t4);
        const int row = m0 + wm0 + i * 16 + h * 8 + g;
        if (row < M && col < N) put8c<G>(o, row, col, q, alpha, bias);
      }
  }
}

// The register epilogue for fp16 Y (round 7), with bias and GELU fixed at compile time. Each lane first finishes
// its own fragment columns {8j + 2t, 8j + 2t + 1} (the same IEEE fp32 steps as put8c, then fp16 round to nearest
// even) and packs each pair into one 32-bit word; the quad transpose then moves these words (4 shuffles, not 8 of
// int2), and lane t stores columns 8t..8t + 7 in one 16-byte store. Needs N % 8 == 0, Y 16-byte aligned and
// w_scale / bias 8-byte aligned (pairs loaded as float2): epilogue_mode() checks, once per launch. The generic
// regs_epilogue (runtime flags, branches and GELU code in each of its put8c copies) issued about as many
// instructions as the main loop at K = 768, and its code size made tp_128x128w4 wait on instruction fetch (ncu).
template <bool BIAS, bool GELU, class R>
__device__ __forceinline__ void regs_epilogue_h(const Out& o, const R& tc, int m0, int n0, int wm0, int wn0,
                                                int lane) {
  static_assert(R::NI % 4 == 0, "the quad transpose needs groups of 4 n8 blocks (WN % 32 == 0)");
  const int M = o.M, N = o.N;
  const int g = lane >> 2, t4 = lane & 3;
  __half* __restrict__ Y = reinterpret_cast<__half*>(o.y);
#pragma unroll
  for (int jg = 0; jg < R::NI / 4; jg++) {
    const int cb = n0 + wn0 + jg * 32;
    float2 al[4], bi[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      // columns past N only feed chunks that are never stored (N % 8 == 0: a chunk is all in or all out)
      const int c = min(cb + 8 * j + 2 * t4, N - 2);
      const float2 w = __ldg(reinterpret_cast<const float2*>(o.w_scale + c));
      al[j] = make_float2(__fmul_rn(o.x_scale, w.x), __fmul_rn(o.x_scale, w.y));
      if (BIAS) bi[j] = __ldg(reinterpret_cast<const float2*>(o.bias + c));
    }
    const int col = cb + 8 * t4;
#pragma unroll
    for (int i = 0; i < R::MI; i++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        u32 q[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
          float y0 = __fmul_rn(__int2float_rn(tc.acc[i][jg * 4 + j][2 * h]), al[j].x);
          float y1 = __fmul_rn(__int2float_rn(tc.acc[i][jg * 4 + j][2 * h + 1]), al[j].y);
          if (BIAS) {
            y0 = __fadd_rn(y0, bi[j].x);
            y1 = __fadd_rn(y1, bi[j].y);
          }
          if (GELU) {
            y0 = gelu_h(y0);
            y1 = gelu_h(y1);
          }
          __half2 hh = __halves2half2(__float2half_rn(y0), __float2half_rn(y1));
          q[j] = *reinterpret_cast<u32*>(&hh);
        }
        quad_transpose(q, t4);
        const int row = m0 + wm0 + i * 16 + h * 8 + g;
        if (row < M && col < N) *reinterpret_cast<uint4*>(Y + (size_t)row * N + col) = make_uint4(q[0], q[1], q[2], q[3]);
      }
  }
}

// Which register epilogue a launch takes (uniform): 0-3 = regs_epilogue_h<bias, gelu> (fp16 Y, aligned, N % 8 == 0),
// 4 = the generic regs_epilogue.
__device__ __forceinline__ int epilogue_mode(const Out& o) {
  const bool fast = (o.flags & FLAG_HALF) && !(o.N & 7) && !(reinterpret_cast<size_t>(o.y) & 15) &&
                    !(reinterpret_cast<size_t>(o.w_scale) & 7) &&
                    (!(o.flags & FLAG_BIAS) || !(reinterpret_cast<size_t>(o.bias) & 7));
  return fast ? ((o.flags & FLAG_BIAS) ? 1 : 0) + ((o.flags & FLAG_GELU) ? 2 : 0) : 4;
}

template <bool G, class R>
__device__ __forceinline__ void regs_epilogue_any(int mode, const Out& o, const R& tc, int m0, int n0, int wm0,
                                                  int wn0, int lane) {
  if (mode == 0) {
    regs_epilogue_h<false, false>(o, tc, m0, n0, wm0, wn0, lane);
  } else if (mode == 1) {
    regs_epilogue_h<true, false>(o, tc, m0, n0, wm0, wn0, lane);
  } else if (G && mode == 2) {
    regs_epilogue_h<false, true>(o, tc, m0, n0, wm0, wn0, lane);
  } else if (G && mode == 3) {
    regs_epilogue_h<true, true>(o, tc, m0, n0, wm0, wn0, lane);
  } else {
    regs_epilogue<G>(o, tc, m0, n0, wm0, wn0, lane);
  }
}

template <int BM, int BN, int WM, int WN, int STAGES, bool G>
__device__ __forceinline__ void tp_body(const s8* __restrict__ A, const s8* __restrict__ W, const Out& o,
                                        int Kp) {
  typedef Tc2Cfg<BM, BN, WM, WN, STAGES> C;
  typedef TcRole<BM, WM, WN> R;
  static_assert(R::NI % 4 == 0, "the quad transpose needs groups of 4 n8 blocks (WN % 32 == 0)");
  extern __shared__ __align__(128) unsigned char smem[];
  const int M = o.M, N = o.N;
  const int tiles_n = (N + BN - 1) / BN;
  const int tiles = tiles_n * ((M + BM - 1) / BM);
  const int KT = (Kp + BK - 1) / BK;
  const int mine = (int)blockIdx.x < tiles ? (tiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
  const int S = mine * KT;  // (tile, k-tile) steps of this block, one pipeline
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  // Copy mapping as in tc2: chunk column c of rows r0 + j * RSTEP. To keep registers for the accumulators
  // (the loader state lives across the whole loop here), a tile keeps two row pointers and the number of
  // its rows j inside M (N), na (nw), packed as na + 16 nw: rows j >= na lie past M and are zero-filled
  // (src-size 0, nothing read), never stored. (A copy path without the selects for tiles with every row
  // inside was measured in round 9 and not kept: no faster.)
  const int c = threadIdx.x & 7, r0 = threadIdx.x >> 3;
  const u32 dst0 = smem_u32(smem) + r0 * BK + ((c ^ (r0 & 7)) << 4);
  const int rstride = C::RSTEP * Kp;  // <= 128 * 131072 bytes: fits an int
  const s8* pa = A;
  const s8* pw = W;
  int nanw = 0;
  auto rebase = [&](int tile) {
    const int m0 = (tile / tiles_n) * BM, n0 = (tile % tiles_n) * BN;
    pa = A + (size_t)(m0 + r0) * Kp + c * 16;
    pw = W + (size_t)(n0 + r0) * Kp + c * 16;
    // rows m0 + r0 + j * RSTEP < M  <=>  j < ceil((M - m0 - r0) / RSTEP)
    const int na = min(C::LA, (max(M - m0 - r0, 0) + C::RSTEP - 1) / C::RSTEP);
    const int nw = min(C::LW, (max(N - n0 - r0, 0) + C::RSTEP - 1) / C::RSTEP);
    nanw = na + 16 * nw;
  };
  int ld_tile = blockIdx.x, ld_kt = 0;
  if (mine > 0) rebase(ld_tile);
  auto load_next = [&](int s) {  // the next step in (tile, k-tile) order into stage s
    const u32 dst = dst0 + s * C::STAGE_BYTES;
    const int kb = ld_kt * BK;
    const bool ok = kb + c * 16 < Kp;  // K tail: zero-fill
    const s8* qa = pa + kb;
    const s8* qw = pw + kb;
    static_assert(C::LA < 16 && C::LW < 16, "na + 16 nw");
#pragma unroll
    for (int j = 0; j < C::LA; j++) {
      const bool v = ok && j < (nanw & 15);
      cp_async16(dst + j * C::RSTEP * BK, v ? qa + j * rstride : A, v);
    }
#pragma unroll
    for (int j = 0; j < C::LW; j++) {
      const bool v = ok && j < (nanw >> 4);
      cp_async16(dst + (BM + j * C::RSTEP) * BK, v ? qw + j * rstride : W, v);
    }
    if (++ld_kt == KT) {
      ld_kt = 0;
      ld_tile += gridDim.x;
      if (ld_tile < tiles) rebase(ld_tile);
    }
  };

  const int wm0 = (warp % (BM / WM)) * WM, wn0 = (warp / (BM / WM)) * WN;
  const int emode = epilogue_mode(o);
  R tc;
  tc.zero();
#pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    if (s < S) load_next(s);
    cp_async_commit();
  }
  int tile = blockIdx.x, kt = 0;
  const auto off = tc.offsets(wm0, wn0, lane);
#pragma unroll 1
  for (int s = 0; s < S; s++) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int nx = s + STAGES - 1;
    if (nx < S) load_next(nx % STAGES);
    cp_async_commit();
    tc.compute(smem + (s % STAGES) * C::STAGE_BYTES, off);
    if (++kt < KT) continue;
    // Tile done: epilogue from registers while the next tile's first stages are being copied.
    regs_epilogue_any<G>(emode, o, tc, (tile / tiles_n) * BM, (tile % tiles_n) * BN, wm0, wn0, lane);
    tc.zero();
    kt = 0;
    tile += gridDim.x;
  }
  cp_async_wait<0>();
}

// name, BM, BN, WM, WN, STAGES, min blocks per SM, GELU code in NAME. Two kernels each: NAME for layers without
// GELU and NAME_gelu (round 8). NAME is built without GELU code (G = false) except in tp_128x128, whose loop then
// spilled at its 128-register cap (ptxas, nvcc 13.0): there it keeps the code, which its layers never run.
#define VITBIT_TP1(NAME, G, BM, BN, WM, WN, ST, MINB)                                                          \
  extern "C" __global__ void __launch_bounds__(Tc2Cfg<BM, BN, WM, WN, ST>::THREADS, MINB)                      \
      vitbit_gemm_##NAME(const s8* __restrict__ A, const s8* __restrict__ W, void* y, int* partial,           \
                         const float* __restrict__ w_scale, const float* __restrict__ bias, float x_scale,     \
                         int flags, int M, int N, int Kp, int kt_per_split) {                                  \
    Out o{y, nullptr, w_scale, bias, x_scale, flags, M, N};                                                    \
    tp_body<BM, BN, WM, WN, ST, G>(A, W, o, Kp);                                                               \
  }
#define VITBIT_TP(NAME, BM, BN, WM, WN, ST, MINB, GBASE) \
  VITBIT_TP1(NAME, GBASE, BM, BN, WM, WN, ST, MINB)     \
  VITBIT_TP1(NAME##_gelu, true, BM, BN, WM, WN, ST, MINB)

VITBIT_TP(tp_128x128, 128, 128, 64, 32, 3, 2, true)    // 8 warps of 64x32, 96 KB: 2 blocks per SM (H100)
VITBIT_TP(tp_64x128, 64, 128, 64, 32, 3, 3, false)      // 4 warps of 64x32, 72 KB: 3 blocks per SM
VITBIT_TP(tp_64x64, 64, 64, 32, 32, 4, 3, false)        // 4 warps of 32x32, 64 KB: 3 blocks per SM
VITBIT_TP(tp_128x128w4, 128, 128, 64, 64, 3, 2, false)  // 4 warps of 64x64 (fewer ldmatrix per mma), 96 KB
VITBIT_TP(tp_64x32, 64, 32, 16, 32, 4, 4, false)        // small M: 4 warps of 16x32, 48 KB
VITBIT_TP(tp_32x32, 32, 32, 16, 32, 4, 6, false)        // small M: 2 warps of 16x32, 32 KB
VITBIT_TP(tp_256x128, 256, 128, 64, 64, 3, 1, false)   // 8 warps of 64x64, 144 KB: 1 block per SM
VITBIT_TP(tp_128x256, 128, 256, 64, 64, 3, 1, false)   // 8 warps of 64x64, 144 KB: 1 block per SM
VITBIT_TP(tp_128x128w4s2, 128, 128, 64, 64, 2, 2, false)  // 4 warps of 64x64, 2 stages, 64 KB: 2 blocks per SM on Orin too

// ------------------------------------------------------------------------------------------------
// Tensor-core-only GEMM with in-kernel split-K ("tk", for small M): grid (N tiles, M tiles, S); block z
// runs the tc2 main loop on its share of the k-tiles, writes its int32 fragments to the workspace
// (fragment order: one int4 per thread and fragment group, coalesced), then takes a ticket on the tile's
// counter (threadfence-reduction pattern; the counters follow the partials region of the workspace, where
// no tactic writes partials). The block that takes the last ticket adds the other
// S - 1 partials to its registers and runs the register epilogue of tp: no second kernel. Exactness: the
// sum of int32 partials is the int32 sum of all K (two's-complement addition is associative, so the
// arrival order does not matter; the total is within the int32 bound). The last block resets the
// counter to 0; the quantize kernel of every launch also zeroes the counters (the workspace may have
// been used by someone else in between). gridDim.z == 1: no partials, no counter.
// ------------------------------------------------------------------------------------------------
template <int BM, int BN, int WM, int WN, int STAGES, bool G>
__device__ __forceinline__ void tk_body(const s8* __restrict__ A, const s8* __restrict__ W, const Out& o,
                                        int Kp, int kt_per_split, int* __restrict__ ctr) {
  typedef Tc2Cfg<BM, BN, WM, WN, STAGES> C;
  typedef TcRole<BM, WM, WN> R;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int s_last;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int KT = (Kp + BK - 1) / BK;
  const int kt0 = blockIdx.z * kt_per_split;
  const int nkt = max(0, min(KT, kt0 + kt_per_split) - kt0);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wm0 = (warp % (BM / WM)) * WM, wn0 = (warp / (BM / WM)) * WN;
  R tc;
  tc.zero();
  tc2_mainloop<BM, BN, WM, WN, STAGES>(A, W, o.M, o.N, Kp, m0, n0, kt0, nkt, smem, tc, wm0, wn0, lane);
  const int S = gridDim.z;
  if (S > 1) {
    constexpr int V = R::MI * R::NI;  // int4 per thread
    const int tile = blockIdx.y * gridDim.x + blockIdx.x;
    int4* part = reinterpret_cast<int4*>(o.partial);
    int4* mine = part + (size_t)(tile * S + blockIdx.z) * V * C::THREADS + threadIdx.x;
#pragma unroll
    for (int i = 0; i < R::MI; i++)
#pragma unroll
      for (int j = 0; j < R::NI; j++)
        __stcg(mine + (i * R::NI + j) * C::THREADS, make_int4(tc.acc[i][j][0], tc.acc[i][j][1], tc.acc[i][j][2], tc.acc[i][j][3]));
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      const int last = atomicAdd(ctr + tile, 1) == S - 1;
      if (last) ctr[tile] = 0;  // every block of this tile has arrived: ready for the next launch
      s_last = last;
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
#pragma unroll 1
    for (int z = 0; z < S; z++) {
      if (z == (int)blockIdx.z) continue;
      const int4* p = part + (size_t)(tile * S + z) * V * C::THREADS + threadIdx.x;
#pragma unroll
      for (int i = 0; i < R::MI; i++)
#pragma unroll
        for (int j = 0; j < R::NI; j++) {
          const int4 u = __ldcg(p + (i * R::NI + j) * C::THREADS);
          tc.acc[i][j][0] += u.x;
          tc.acc[i][j][1] += u.y;
          tc.acc[i][j][2] += u.z;
          tc.acc[i][j][3] += u.w;
        }
    }
  }
  regs_epilogue_any<G>(epilogue_mode(o), o, tc, m0, n0, wm0, wn0, lane);
}

// name, BM, BN, WM, WN, STAGES, min blocks per SM; NAME and NAME_gelu as for VITBIT_TP
#define VITBIT_TK1(NAME, G, BM, BN, WM, WN, ST, MINB)                                                         \
  extern "C" __global__ void __launch_bounds__(Tc2Cfg<BM, BN, WM, WN, ST>::THREADS, MINB)                      \
      vitbit_gemm_##NAME(const s8* __restrict__ A, const s8* __restrict__ W, void* y, int* partial,           \
                         const float* __restrict__ w_scale, const float* __restrict__ bias, float x_scale,     \
                         int flags, int M, int N, int Kp, int kt_per_split, int* ctr) {                        \
    Out o{y, partial, w_scale, bias, x_scale, flags, M, N};                                                    \
    tk_body<BM, BN, WM, WN, ST, G>(A, W, o, Kp, kt_per_split, ctr);                                            \
  }
#define VITBIT_TK(NAME, BM, BN, WM, WN, ST, MINB)     \
  VITBIT_TK1(NAME, false, BM, BN, WM, WN, ST, MINB) \
  VITBIT_TK1(NAME##_gelu, true, BM, BN, WM, WN, ST, MINB)

VITBIT_TK(tk_64x64, 64, 64, 32, 32, 4, 3)     // 4 warps of 32x32, 4 stages
