// Kernels of tools/speed_of_light.py (a measurement tool, not part of the SDK; built at run time by
// edgesdk.kernels._cuda like the plugins, Ampere instructions only).
//
// sol_read<U>: the least work any kernel that consumes a format must do: read `n16` 16-byte words of
// `src` once each (16-byte loads, evict-first) and write `w16` 16-byte words of `dst` (the output), nothing
// else. Thread t of T reads words t + k·T; each thread keeps U independent loads in flight per iteration
// (whole rounds unpredicated, so all U are in flight; in the last partial round loads past the end are
// predicated off). The output
// words depend on what was read (XOR of the words), so the writes cannot start before the reads return,
// as in a real kernel. The fastest (grid, block, U) per byte count is the floor the tool reports.
#define SOL_READ(NAME, U)                                                                                  \
  extern "C" __global__ void __launch_bounds__(512) NAME(const uint4* __restrict__ src,                 \
                                                           unsigned long long n16, uint4* __restrict__ dst, \
                                                           unsigned long long w16) {                       \
    const unsigned long long T = static_cast<unsigned long long>(gridDim.x) * blockDim.x;                 \
    const unsigned long long first = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x; \
    unsigned int acc = 0;                                                                                  \
    unsigned long long i = first;                                                                          \
    for (; i + (U - 1) * T < n16; i += U * T) { /* whole rounds: U loads, unpredicated, all in flight */ \
      uint4 v[U];                                                                                          \
      _Pragma("unroll") for (int u = 0; u < U; ++u) v[u] = __ldcs(src + i + u * T);                       \
      _Pragma("unroll") for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;              \
    }                                                                                                      \
    if (i < n16) { /* the last partial round */                                                          \
      uint4 v[U];                                                                                          \
      _Pragma("unroll") for (int u = 0; u < U; ++u) {                                                      \
        v[u] = i + u * T < n16 ? __ldcs(src + i + u * T) : make_uint4(0u, 0u, 0u, 0u);                     \
      }                                                                                                    \
      _Pragma("unroll") for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;              \
    }                                                                                                      \
    for (unsigned long long j = first; j < w16; j += T) dst[j] = make_uint4(acc, static_cast<unsigned int>(j), 0u, 0u); \
  }

SOL_READ(sol_read1, 1)
SOL_READ(sol_read4, 4)
SOL_READ(sol_read8, 8)
