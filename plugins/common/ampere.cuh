// Ampere (sm_80+) PTX wrappers shared by every edgesdk kernel: one source serves Orin (sm_87) and
// sm_90, so only Ampere instructions appear here (cp.async, mma.sync). Included as
// "common/ampere.cuh" (plugins/ is on the include path of nvcc, NVRTC and tools/compile_kernels.py).
#pragma once
#if defined(__CUDACC_RTC__)
// NVRTC (the launchers' compiler where nvcc is not on PATH, as on a stock JetPack) has no C library headers.
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
typedef unsigned long long uintptr_t;  // 64-bit devices only (sm_87, sm_90)
#ifndef INFINITY
#define INFINITY (__int_as_float(0x7f800000))  // device code only
#endif
#else
#include <stdint.h>
#endif

// Shared-memory address of a generic pointer, as the 32-bit operand cp.async/ldmatrix take.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Wait until at most N cp.async groups of this thread are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// c[0..3] += A (16x16 fp16, row) * B (16x8 fp16, col), fp32 accumulation.
__device__ __forceinline__ void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
