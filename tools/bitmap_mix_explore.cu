// Exploration kernels for tools/bitmap_mix_explore.py (not part of the SDK): a plain dense GEMV over
// whole rows of W, to run *beside* the bitmap decode kernel on the same SMs.
//
// Question: the bitmap decode path is bound by the SM's integer pipe and latency (~7 weights per
// SM-clock, docs/bitmap_linear.md), not by DRAM (35-40 % of peak on the H100). A dense GEMV is the
// opposite: a few FP instructions per 16-byte load, bound by DRAM. If a fraction of a layer's rows is
// kept dense and streamed by these warps while the decode warps work on the rest, both pipes work at
// once. These kernels are small (128 threads, <= 64 registers, no shared memory) so that one block fits
// on an SM next to the decode kernel's blocks.
//
// mix_dense_f16_m<MR>: W fp16 [N, K] row-major, K % 8 == 0. mix_dense_i8_m<MR>: W int8 [N, K], K % 16
// == 0, Y = (X . W^T) * scales. X fp16 [MR, K], Y fp16 with row stride ldy (the dense rows' outputs
// are a column block of the layer's Y). One warp per row (grid-stride), lane = 16-byte chunks
// lane, lane + 32, ..., U loads in flight per lane, fp32 accumulation, shuffle reduction.
#include <cuda_fp16.h>
#include <stdint.h>

namespace {

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float2 h2f(uint32_t w) {
  return __half22float2(*reinterpret_cast<const __half2*>(&w));
}

// int8 word (4 values, pre-XORed with 0x80808080) -> two half2 holding the exact integers
__device__ __forceinline__ void i8x4_to_f(uint32_t wx, float (&f)[4]) {
  const uint32_t lo = __byte_perm(wx, 0x64646464u, 0x4140);
  const uint32_t hi = __byte_perm(wx, 0x64646464u, 0x4342);
  const __half2 b = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));
  const __half2 l = __hsub2(*reinterpret_cast<const __half2*>(&lo), b);
  const __half2 h = __hsub2(*reinterpret_cast<const __half2*>(&hi), b);
  const float2 a = __half22float2(l), c = __half22float2(h);
  f[0] = a.x; f[1] = a.y; f[2] = c.x; f[3] = c.y;
}

template <int MR, int U>
__device__ __forceinline__ void dense_f16(const __half* __restrict__ X, const __half* __restrict__ W,
                                          const float* __restrict__ scales, __half* __restrict__ Y, int N,
                                          int K, int ldy) {
  const int lane = threadIdx.x & 31;
  const int nw = gridDim.x * (blockDim.x >> 5);
  const int C = K >> 3;
  for (int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < N; row += nw) {
    const uint4* wr = reinterpret_cast<const uint4*>(W + static_cast<size_t>(row) * K);
    float acc[MR];
#pragma unroll
    for (int m = 0; m < MR; ++m) acc[m] = 0.f;
    for (int c0 = lane; c0 < C; c0 += 32 * U) {
      uint4 w[U];
#pragma unroll
      for (int u = 0; u < U; ++u) w[u] = c0 + 32 * u < C ? ld_stream(wr + c0 + 32 * u) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + 32 * u;
        if (c < C) {
          const float2 w0 = h2f(w[u].x), w1 = h2f(w[u].y), w2 = h2f(w[u].z), w3 = h2f(w[u].w);
#pragma unroll
          for (int m = 0; m < MR; ++m) {
            const uint4 xv = __ldg(reinterpret_cast<const uint4*>(X + static_cast<size_t>(m) * K) + c);
            const float2 x0 = h2f(xv.x), x1 = h2f(xv.y), x2 = h2f(xv.z), x3 = h2f(xv.w);
            float s = acc[m];
            s = fmaf(w0.x, x0.x, s); s = fmaf(w0.y, x0.y, s); s = fmaf(w1.x, x1.x, s); s = fmaf(w1.y, x1.y, s);
            s = fmaf(w2.x, x2.x, s); s = fmaf(w2.y, x2.y, s); s = fmaf(w3.x, x3.x, s); s = fmaf(w3.y, x3.y, s);
            acc[m] = s;
          }
        }
      }
    }
#pragma unroll
    for (int m = 0; m < MR; ++m) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
    }
    if (lane == 0) {
      const float sc = scales[row];
#pragma unroll
      for (int m = 0; m < MR; ++m) Y[static_cast<size_t>(m) * ldy + row] = __float2half_rn(acc[m] * sc);
    }
  }
}

template <int MR, int U>
__device__ __forceinline__ void dense_i8(const __half* __restrict__ X, const int8_t* __restrict__ W,
                                         const float* __restrict__ scales, __half* __restrict__ Y, int N,
                                         int K, int ldy) {
  const int lane = threadIdx.x & 31;
  const int nw = gridDim.x * (blockDim.x >> 5);
  const int C = K >> 4;
  for (int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < N; row += nw) {
    const uint4* wr = reinterpret_cast<const uint4*>(W + static_cast<size_t>(row) * K);
    float acc[MR];
#pragma unroll
    for (int m = 0; m < MR; ++m) acc[m] = 0.f;
    for (int c0 = lane; c0 < C; c0 += 32 * U) {
      uint4 w[U];
#pragma unroll
      for (int u = 0; u < U; ++u) w[u] = c0 + 32 * u < C ? ld_stream(wr + c0 + 32 * u) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + 32 * u;
        if (c < C) {
          float wf[16];
          i8x4_to_f(w[u].x ^ 0x80808080u, *reinterpret_cast<float(*)[4]>(wf));
          i8x4_to_f(w[u].y ^ 0x80808080u, *reinterpret_cast<float(*)[4]>(wf + 4));
          i8x4_to_f(w[u].z ^ 0x80808080u, *reinterpret_cast<float(*)[4]>(wf + 8));
          i8x4_to_f(w[u].w ^ 0x80808080u, *reinterpret_cast<float(*)[4]>(wf + 12));
#pragma unroll
          for (int m = 0; m < MR; ++m) {
            const uint4* xp = reinterpret_cast<const uint4*>(X + static_cast<size_t>(m) * K) + 2 * c;
            const uint4 xa = __ldg(xp), xb = __ldg(xp + 1);
            const uint32_t xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
            float s = acc[m];
#pragma unroll
            for (int q = 0; q < 8; ++q) {
              const float2 x = h2f(xw[q]);
              s = fmaf(wf[2 * q], x.x, s);
              s = fmaf(wf[2 * q + 1], x.y, s);
            }
            acc[m] = s;
          }
        }
      }
    }
#pragma unroll
    for (int m = 0; m < MR; ++m) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
    }
    if (lane == 0) {
      const float sc = scales[row];
#pragma unroll
      for (int m = 0; m < MR; ++m) Y[static_cast<size_t>(m) * ldy + row] = __float2half_rn(acc[m] * sc);
    }
  }
}

}  // namespace

#define MIX_DENSE(MR, U)                                                                                   \
  extern "C" __global__ void __launch_bounds__(128, 8) mix_dense_f16_m##MR##_u##U(                         \
      const __half* __restrict__ X, const __half* __restrict__ W, const float* __restrict__ scales,        \
      __half* __restrict__ Y, int N, int K, int ldy) {                                                     \
    dense_f16<MR, U>(X, W, scales, Y, N, K, ldy);                                                          \
  }                                                                                                        \
  extern "C" __global__ void __launch_bounds__(128, 8) mix_dense_i8_m##MR##_u##U(                          \
      const __half* __restrict__ X, const int8_t* __restrict__ W, const float* __restrict__ scales,        \
      __half* __restrict__ Y, int N, int K, int ldy) {                                                     \
    dense_i8<MR, U>(X, W, scales, Y, N, K, ldy);                                                           \
  }

MIX_DENSE(1, 4)
MIX_DENSE(1, 8)
MIX_DENSE(4, 4)

// Round 2: the same GEMV fed by a cp.async ring in shared memory (S stages of 32 V 16-byte chunks per
// warp, 12 KB in flight per warp at S = 6, V = 4) instead of registers, so that four warps per SM keep
// enough bytes in flight to stream at DRAM speed next to the decode kernel. Warp w streams the
// contiguous rows [N w / W, N (w + 1) / W) of all W warps as one byte range; a stage never crosses a
// row (its tail chunks are not copied), so a row's partial sums are reduced after its last stage.
// Dynamic shared memory: 4 warps * S * V * 512 bytes.
namespace {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

template <bool I8, int MR, int S, int V>
__device__ __forceinline__ void dense_stream(const __half* __restrict__ X, const uint8_t* __restrict__ W,
                                             const float* __restrict__ scales, __half* __restrict__ Y, int N,
                                             int K, int ldy) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int CPS = 32 * V;  // chunks per stage
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nw = gridDim.x * (blockDim.x >> 5);
  const int gw = blockIdx.x * (blockDim.x >> 5) + warp;
  const int r0 = static_cast<int>(static_cast<long long>(N) * gw / nw);
  const int r1 = static_cast<int>(static_cast<long long>(N) * (gw + 1) / nw);
  const int row_bytes = I8 ? K : 2 * K;
  const int C = row_bytes >> 4;
  const int spr = (C + CPS - 1) / CPS;
  const int total = (r1 - r0) * spr;
  const uint32_t ring = smem_addr(smem) + static_cast<uint32_t>(warp * S * CPS * 16);
  const uint8_t* base = W + static_cast<size_t>(r0) * row_bytes;
  auto issue = [&](int j) {
    if (j < total) {
      const int r = j / spr, sc = j - r * spr;
      const uint8_t* src = base + static_cast<size_t>(r) * row_bytes;
      const uint32_t dst = ring + static_cast<uint32_t>((j % S) * CPS * 16);
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const int c = sc * CPS + v * 32 + lane;
        if (c < C)
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst + (v * 32 + lane) * 16),
                       "l"(src + static_cast<size_t>(c) * 16));
      }
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s) issue(s);
  float acc[MR];
#pragma unroll
  for (int m = 0; m < MR; ++m) acc[m] = 0.f;
  for (int j = 0; j < total; ++j) {
    issue(j + S - 1);
    asm volatile("cp.async.wait_group %0;\n" ::"n"(S - 1));
    __syncwarp();
    const int r = j / spr, sc = j - r * spr;
    const uint8_t* sl = smem + warp * S * CPS * 16 + (j % S) * CPS * 16;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int c = sc * CPS + v * 32 + lane;
      if (c < C) {
        const uint4 w = *reinterpret_cast<const uint4*>(sl + (v * 32 + lane) * 16);
        if constexpr (!I8) {
          const float2 w0 = h2f(w.x), w1 = h2f(w.y), w2 = h2f(w.z), w3 = h2f(w.w);
#pragma unroll
          for (int m = 0; m < MR; ++m) {
            const uint4 xv = __ldg(reinterpret_cast<const uint4*>(X + static_cast<size_t>(m) * K) + c);
            const float2 x0 = h2f(xv.x), x1 = h2f(xv.y), x2 = h2f(xv.z), x3 = h2f(xv.w);
            float s = acc[m];
            s = fmaf(w0.x, x0.x, s); s = fmaf(w0.y, x0.y, s); s = fmaf(w1.x, x1.x, s); s = fmaf(w1.y, x1.y, s);
            s = fmaf(w2.x, x2.x, s); s = fmaf(w2.y, x2.y, s); s = fmaf(w3.x, x3.x, s); s = fmaf(w3.y, x3.y, s);
            acc[m] = s;
          }
        } else {
          float wf[16];
          i8x4_to_f(w.x ^ 0x80808080u, *reinterpret_cast<float(*)[4]>(wf));
          i8x4_to_f(w.y ^ 0x80808080u, *reinterpret_cast<float(*)[4]>(wf + 4));
          i8x4_to_f(w.z ^ 0x80808080u, *reinterpret_cast<float(*)[4]>(wf + 8));
          i8x4_to_f(w.w ^ 0x80808080u, *reinterpret_cast<float(*)[4]>(wf + 12));
#pragma unroll
          for (int m = 0; m < MR; ++m) {
            const uint4* xp = reinterpret_cast<const uint4*>(X + static_cast<size_t>(m) * K) + 2 * c;
            const uint4 xa = __ldg(xp), xb = __ldg(xp + 1);
            const uint32_t xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
            float s = acc[m];
#pragma unroll
            for (int q = 0; q < 8; ++q) {
              const float2 x = h2f(xw[q]);
              s = fmaf(wf[2 * q], x.x, s);
              s = fmaf(wf[2 * q + 1], x.y, s);
            }
            acc[m] = s;
          }
        }
      }
    }
    __syncwarp();
    if (sc == spr - 1) {
#pragma unroll
      for (int m = 0; m < MR; ++m) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
      }
      if (lane == 0) {
        const float scl = scales[r0 + r];
#pragma unroll
        for (int m = 0; m < MR; ++m) Y[static_cast<size_t>(m) * ldy + r0 + r] = __float2half_rn(acc[m] * scl);
      }
#pragma unroll
      for (int m = 0; m < MR; ++m) acc[m] = 0.f;
    }
  }
  asm volatile("cp.async.wait_group 0;\n" ::);
}

}  // namespace

#define MIX_STREAM(MR)                                                                                     \
  extern "C" __global__ void __launch_bounds__(128, 8) mix_stream_f16_m##MR(                               \
      const __half* __restrict__ X, const uint8_t* __restrict__ W, const float* __restrict__ scales,       \
      __half* __restrict__ Y, int N, int K, int ldy) {                                                     \
    dense_stream<false, MR, 6, 4>(X, W, scales, Y, N, K, ldy);                                             \
  }                                                                                                        \
  extern "C" __global__ void __launch_bounds__(128, 8) mix_stream_i8_m##MR(                                \
      const __half* __restrict__ X, const uint8_t* __restrict__ W, const float* __restrict__ scales,       \
      __half* __restrict__ Y, int N, int K, int ldy) {                                                     \
    dense_stream<true, MR, 6, 4>(X, W, scales, Y, N, K, ldy);                                              \
  }

MIX_STREAM(1)
MIX_STREAM(4)
