// Ceiling microbenchmarks for the Ampere instructions the VitBit GEMM may use (tools/vitbit_gemm_ceiling.py).
//
//   ceil_mma_reg:   mma.sync.m16n8k32.s8 from registers only, 8 independent accumulators per warp.
//   ceil_mma_ldm<NI>: the same with the tensor-core warp's ldmatrix.x4 traffic in the loop, read from an
//                   XOR-swizzled shared tile exactly like the GEMM (warp tile 64 x 8*NI: 4 A + NI/2 B
//                   ldmatrix.x4 per 4*NI mma).
//   ceil_corun:     a block of `tc_warps` mma.sync warps (as ceil_mma_reg) plus `x_warps` warps issuing dp4a
//                   (mode 1) or FFMA (mode 2) on independent accumulators; each warp records its clock64
//                   start/end so the host gets the tensor-core rate alone and while CUDA-core warps co-run.
// Every kernel writes its accumulators to `out` (no dead code) and per-block clock64 / globaltimer spans.
#include "common/ampere.cuh"

typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ void mma_s8(int* c, const u32* a, const u32* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void ldsm4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ u64 gtime() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ int swz(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

// spans[block] = {clock64 cycles, globaltimer ns} of thread 0 (all warps start together)
extern "C" __global__ void ceil_mma_reg(int iters, int* out, u64* spans) {
  u32 a[4], b[2];
#pragma unroll
  for (int i = 0; i < 4; i++) a[i] = threadIdx.x * 0x01030507u + i;
  b[0] = threadIdx.x * 0x0F0E0D0Cu;
  b[1] = b[0] ^ 0x5A5A5A5Au;
  int acc[8][4];
#pragma unroll
  for (int j = 0; j < 8; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) acc[j][e] = 0;
  __syncthreads();
  u64 c0 = clock64(), g0 = gtime();
#pragma unroll 1
  for (int it = 0; it < iters; it++) {
#pragma unroll
    for (int j = 0; j < 8; j++) mma_s8(acc[j], a, b);
  }
  __syncthreads();
  u64 c1 = clock64(), g1 = gtime();
  int s = 0;
#pragma unroll
  for (int j = 0; j < 8; j++) s += acc[j][0] ^ acc[j][1] ^ acc[j][2] ^ acc[j][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) {
    spans[2 * blockIdx.x] = c1 - c0;
    spans[2 * blockIdx.x + 1] = g1 - g0;
  }
}

// Shared tile: 128 A rows + 128 W rows of 128 bytes (one 128x128 pipeline stage). Warp w: A rows
// (w & 1) * 64, W rows (w >> 1) * 8 * NI (mod 128).
template <int NI>
__device__ __forceinline__ void mma_ldm(int iters, int* out, u64* spans) {
  __shared__ __align__(128) unsigned char sm[256 * 128];
  for (int i = threadIdx.x; i < 256 * 128 / 4; i += blockDim.x)
    reinterpret_cast<u32*>(sm)[i] = (u32)i * 2654435761u;
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wm0 = (warp & 1) * 64, wn0 = ((warp >> 1) * 8 * NI) & 127;
  const u32 base = smem_u32(sm);
  int acc[4][NI][4];
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < NI; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[i][j][e] = 0;
  u64 c0 = clock64(), g0 = gtime();
#pragma unroll 1
  for (int it = 0; it < iters; it++) {
    const int ks = it & 3;
    u32 a[4][4], b[NI][2];
#pragma unroll
    for (int i = 0; i < 4; i++)
      ldsm4(base + swz(wm0 + i * 16 + (lane & 15), ks * 2 + (lane >> 4)), a[i][0], a[i][1], a[i][2], a[i][3]);
#pragma unroll
    for (int j = 0; j < NI; j += 2)
      ldsm4(base + swz(128 + ((wn0 + j * 8) & 127) + (lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1)),
            b[j][0], b[j][1], b[j + 1][0], b[j + 1][1]);
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
      for (int j = 0; j < NI; j++) mma_s8(acc[i][j], a[i], b[j]);
  }
  __syncthreads();
  u64 c1 = clock64(), g1 = gtime();
  int s = 0;
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < NI; j++) s += acc[i][j][0] ^ acc[i][j][1] ^ acc[i][j][2] ^ acc[i][j][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) {
    spans[2 * blockIdx.x] = c1 - c0;
    spans[2 * blockIdx.x + 1] = g1 - g0;
  }
}
extern "C" __global__ void ceil_mma_ldm_w64x32(int iters, int* out, u64* spans) { mma_ldm<4>(iters, out, spans); }
extern "C" __global__ void ceil_mma_ldm_w64x64(int iters, int* out, u64* spans) { mma_ldm<8>(iters, out, spans); }

// Co-running: warps < tc_warps run `iters` x 8 mma; the others `x_iters` x 8 dp4a (mode 1) or FFMA (mode 2).
// wspans[block * 32 + warp] = {start, end} clock64 of the warp (lane 0).
extern "C" __global__ void ceil_corun(int iters, int tc_warps, int x_iters, int mode, int* out, u64* wspans) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int s = 0;
  __syncthreads();
  u64 c0 = clock64();
  if (warp < tc_warps) {
    u32 a[4], b[2];
#pragma unroll
    for (int i = 0; i < 4; i++) a[i] = threadIdx.x * 0x01030507u + i;
    b[0] = threadIdx.x * 0x0F0E0D0Cu;
    b[1] = b[0] ^ 0x5A5A5A5Au;
    int acc[8][4];
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[j][e] = 0;
#pragma unroll 1
    for (int it = 0; it < iters; it++) {
#pragma unroll
      for (int j = 0; j < 8; j++) mma_s8(acc[j], a, b);
    }
#pragma unroll
    for (int j = 0; j < 8; j++) s += acc[j][0] ^ acc[j][1] ^ acc[j][2] ^ acc[j][3];
  } else if (mode == 1) {
    int acc[8];
    const int a = threadIdx.x * 0x01030507;
    int b[8];
#pragma unroll
    for (int j = 0; j < 8; j++) { acc[j] = j; b[j] = a ^ (j * 0x11111111); }
#pragma unroll 1
    for (int it = 0; it < x_iters; it++) {
#pragma unroll
      for (int j = 0; j < 8; j++) acc[j] = __dp4a(a, b[j], acc[j]);
    }
#pragma unroll
    for (int j = 0; j < 8; j++) s += acc[j];
  } else {
    float acc[8];
    const float a = 1.0f + threadIdx.x * 1e-7f;
    float b[8];
#pragma unroll
    for (int j = 0; j < 8; j++) { acc[j] = (float)j; b[j] = 1.0f - j * 1e-8f; }
#pragma unroll 1
    for (int it = 0; it < x_iters; it++) {
#pragma unroll
      for (int j = 0; j < 8; j++) acc[j] = __fmaf_rn(a, acc[j], b[j]);
    }
#pragma unroll
    for (int j = 0; j < 8; j++) s += __float_as_int(acc[j]);
  }
  u64 c1 = clock64();
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (lane == 0) {
    wspans[2 * (blockIdx.x * 32 + warp)] = c0;
    wspans[2 * (blockIdx.x * 32 + warp) + 1] = c1;
  }
}
