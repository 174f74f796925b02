// Kernels of tools/orin_bw_proxy.py (a measurement tool, not part of the SDK; built at run time by
// edgesdk.kernels._cuda like the plugins, Ampere instructions only).
//
// bw_hog: streams a large buffer from DRAM on the SMs of one green context until a flag in device memory
// becomes non-zero (or max_ns have passed), so that another green context's kernels see the memory
// system loaded. Each thread keeps 4 independent 16-byte loads in flight per iteration; the load
// intensity is set by the grid (warps per SM): its rate follows its loads in flight over the latency,
// so it takes a share of the memory system that grows with how many loads it keeps in flight. Bytes read
// are added to count[0]; block 0 writes the run's duration (globaltimer, ns) to count[1].
// Addresses: thread t reads elements t + k·S (mod the power-of-two buffer), S = the thread count rounded up
// to a power of two, so every element has one owner thread and nothing is re-read before a whole pass
// over the buffer. (With S = the thread count itself, 200 ms runs counted 6-15 TB/s on an H100 whose 5 ms
// runs counted 2.8-3.3 TB/s, the latter equal to Nsight Compute's DRAM bytes: more than DRAM can deliver,
// most likely warps drifting into convoys that re-read each other's lines from L2; not profiled.)
//
// bw_pace: the paced variant. Each lane issues one `prefetch.global.L2` of a 128-byte line every
// `period` SM clocks (clock64; warps staggered over the period), so the requested rate is fixed
// (warps x 4 KB per period) whatever the latency: prefetches return nothing to the SM, so none of them
// waits for another. What reaches DRAM is not counted here (a prefetch may be dropped); the tool
// calibrates each level by the dense baseline's measured bandwidth instead.
//
// sm_clock: one thread per block spins `cycles` SM clocks and writes (clock64 span, globaltimer span):
// the SM clock of the context it runs in, under whatever else runs at the time.
__device__ __forceinline__ unsigned long long gtimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Warp-uniform stop test (call it from every lane of a warp at the same iteration): lane 0 reads the flag
// (volatile: from L2, never a stale L1 line) and the clock, the warp follows it.
__device__ __forceinline__ bool stop_now(const int* stop, unsigned long long t0, unsigned long long max_ns) {
  int s = 0;
  if ((threadIdx.x & 31) == 0) s = *reinterpret_cast<const volatile int*>(stop) != 0 || gtimer() - t0 > max_ns;
  return __shfl_sync(0xffffffffu, s, 0) != 0;
}

// Thread t of `threads` touches elements t + k·stride: the thread count rounded up to a power of two.
__device__ __forceinline__ unsigned long long owner_stride(unsigned long long threads) {
  return threads > 1 ? 1ull << (64 - __clzll(threads - 1)) : 1ull;
}

extern "C" __global__ void __launch_bounds__(128) bw_hog(const uint4* __restrict__ buf, unsigned long long mask,
                                                         const int* stop, unsigned long long* count,
                                                         unsigned long long max_ns, uint4* sink) {
  const unsigned long long t0 = gtimer();
  const unsigned long long threads = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  const unsigned long long stride = owner_stride(threads);
  unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned int acc = 0;
  unsigned long long n = 0;
  for (;;) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = __ldcs(buf + ((i + u * stride) & mask));
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    i += 4 * stride;
    ++n;
    if ((n & 63) == 0 && stop_now(stop, t0, max_ns)) break;  // every lane runs the same iterations
  }
  atomicAdd(count, n * 64ull);
  if (blockIdx.x == 0 && threadIdx.x == 0) count[1] = gtimer() - t0;
  if (acc == 0x9e3779b9u) sink[0] = make_uint4(acc, 0u, 0u, 0u);  // keeps the loads; (almost) never true
}

extern "C" __global__ void __launch_bounds__(128) bw_pace(const char* __restrict__ buf, unsigned long long lines_mask,
                                                          const int* stop, unsigned long long* count,
                                                          unsigned long long max_ns, long long period) {
  const unsigned long long t0 = gtimer();
  const unsigned long long threads = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  const unsigned long long stride = owner_stride(threads);
  unsigned long long line = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int warps = blockDim.x >> 5;
  long long next = clock64() + period * (threadIdx.x >> 5) / warps;
  unsigned long long n = 0;
  for (;;) {
    while (clock64() < next) {
    }
    next += period;
    asm volatile("prefetch.global.L2 [%0];" ::"l"(buf + ((line & lines_mask) << 7)));
    line += stride;
    ++n;
    if ((n & 15) == 0 && stop_now(stop, t0, max_ns)) break;
  }
  atomicAdd(count, n * 128ull);
  if (blockIdx.x == 0 && threadIdx.x == 0) count[1] = gtimer() - t0;
}

extern "C" __global__ void sm_clock(unsigned long long cycles, unsigned long long* out) {
  if (threadIdx.x != 0) return;
  const unsigned long long c0 = clock64(), t0 = gtimer();
  while (static_cast<unsigned long long>(clock64()) - c0 < cycles) {
  }
  const unsigned long long c1 = clock64(), t1 = gtimer();
  out[2 * blockIdx.x] = c1 - c0;
  out[2 * blockIdx.x + 1] = t1 - t0;
}
