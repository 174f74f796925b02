// sparse_kv: bitmap-sparse KV cache (MUSTAFAR-style per-token magnitude pruning) and flash-decoding
// attention over it. Format: edgesdk/formats/sparse_kv.py (the numpy twin of every kernel here).
//
// Cache of one (sequence b, KV head h), for K and V alike, after L tokens:
//   tokens [0, n_comp)  compressed records, fixed size R bytes each (R % 8 == 0):
//                       uint64 bitmap[D/64] (bit c = channel c kept) | fp16 kept values in channel
//                       order | zero padding to KP = round_up(keep, 4) values; D = 64 records with padding
//                       (keep % 4 != 0) hold a store order x (0..63) in their last half: bitmap bit c' and the
//                       values (ascending c') stand for channel c' ^ x (compress_tile picks x; x = 0: as above);
//                       stored in groups of 16 tokens, chunk-major: 8-byte unit k of token t's record at byte
//                       16 R (t / 16) + 128 k + 8 (t % 16) of the (b, h) row (record capacity a multiple of 16),
//                       so that 16 lanes loading unit k of a tile's 16 records read 128 contiguous bytes
//   tokens [n_comp, L)  dense fp16 rows in a ring of C = W + A slots (token t lives in slot t % C)
//   n_comp = L >= W + A ? ((L - W) / A) * A : 0       (W: dense window, A: append group)
// Per-token pruning keeps exactly `keep` channels per token (largest |x|, ties to the lower channel),
// so every record has the same size: no offsets, O(1) append, random access for the token split.
//
// Kernels (Ampere instructions only: mma.sync, ldmatrix, movmatrix, cp.async, redux.sync, popc; sm_87, sm_90):
//   sparse_kv_attn2_d{D}_g{GP}  tactics 1, 2 (default): grid (NS, Hkv, B), 128 threads, warp-streaming
//       flash attention; see attn2_split. Tactic 2 also merges the splits (last block per (b, h)).
//       _w8 / _w16: 8 or 16 warps (tactics 3, 4); sparse_kv_attn2r_d64_g{GP}_w16: 16 warps with 48-byte records
//       loaded into registers instead of staged (decode_row64_reg); sparse_kv_attn2p_d64_g{GP}_w16: the same with the
//       tiles double-buffered, the decode of tile i + 1 spliced into the multiply of tile i (RegDecode64; for splits of
//       >= 6 tiles per warp); sparse_kv_dense2_*: the same body on a dense cache. The _w16_sk kernels (tactic 5,
//       stream-K): the 16-warp ones over equal shares of all pairs' tiles (attn2_entry).
//   sparse_kv_attn_d{D}_g{GP}   tactic 0 (and the dense baseline): grid (NS, Hkv, B), 256 threads. One
//       block = one (b, h) and TS tokens.
//       K: one thread per token, a sparse dot product over the record's set bits (GP query heads of
//          the GQA group at once), scores in shared memory; block max/sum (fp32, exp2).
//       V: each warp takes 16-token tiles, decompresses records (2 lanes per token) into a dense
//          fp16 tile in shared memory and multiplies P[16 (heads) x 16] x V[16 x D] with
//          mma.sync.m16n8k16 (fp32 accumulation; P rounded to fp16, l summed from the same values).
//       Writes the split's (m, l, acc[D]) to the workspace.
//   sparse_kv_combine_d{D}      grid (B * Hq), 256 threads: merges the splits (merge_splits), writes fp16 out.
//   sparse_kv_prefill_d{D}      grid (ceil(S / 16), Hkv, B), 512 threads: compress tokens [0, n_comp), copy the
//                               rest into the ring (one warp per token, K then V); then warp 0 gives the block's
//                               16-token tile of records its store order (compress_tile; D = 64, `sched`).
//   sparse_kv_append_d{D}       grid (ceil(A / 16) + 1, Hkv, B), 512 threads: write token lens[b]-1 into the ring;
//                               when the window reaches W + A, compress its oldest A tokens (block i: those in the
//                               i-th 16-token tile they touch) and schedule them once lens[b] >= `sched` (> 0).
// Top-k per token: a warp-wide radix select on the 15-bit magnitude |x| (fp16 bits & 0x7fff) with
// __reduce_add_sync, then ballots give bitmap, tie ranks and value positions.
#include <cuda_fp16.h>

#include "common/ampere.cuh"

#ifdef SKV_TIMELINE
// Measurement builds only (tools/sparse_kv_timeline.py compiles a copy of this file with SKV_TIMELINE defined; the
// shipped kernels have no stamps): thread 0 of each streaming attention block writes (%globaltimer, clock64) at the
// phase boundaries of attn2_split, stamp k of block `linear block index` at skv_timeline[2 (16 block + k) + {0, 1}];
// stamp 7 holds (%smid, 0).
extern "C" {
__device__ unsigned long long skv_timeline[2 * 16 * 8192];
}
__device__ __forceinline__ void skv_stamp(int k) {
  if (threadIdx.x != 0) return;
  const unsigned blk = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (blk >= 8192) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  const unsigned long long c = clock64();
  skv_timeline[2 * (16 * blk + k)] = t;
  skv_timeline[2 * (16 * blk + k) + 1] = c;
  if (k == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    skv_timeline[2 * (16 * blk + 7)] = sm;
  }
}
#define SKV_STAMP(k) skv_stamp(k)
#else
#define SKV_STAMP(k)
#endif

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kCompThreads = 512;  // prefill / append: one warp per token of a 16-token tile
constexpr int kCompWarps = kCompThreads / 32;
constexpr int kTile = 16;

__device__ __forceinline__ void cp_async8_u32(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async8(void* dst, const void* src) { cp_async8_u32(smem_u32(dst), src); }

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ int n_compressed(int L, int W, int A) {
  return L >= W + A ? ((L - W) / A) * A : 0;
}

__device__ __forceinline__ int round_up(int x, int m) { return (x + m - 1) / m * m; }

// Records chunk-major in 16-token groups (see the top): bytes between a record's 8-byte units, and the byte offset of
// the record of token index i (b, h row start + token; rows start on group boundaries) from the records' base.
constexpr int kRecStride = 128;
__device__ __forceinline__ size_t rec_offset(size_t i, int R) {
  return (i & ~static_cast<size_t>(15)) * R + (i & 15) * 8;
}
__device__ __forceinline__ uint2 rec_unit(const uint8_t* rec, int k) {
  return *reinterpret_cast<const uint2*>(rec + kRecStride * k);
}
// Bitmap word j (32-bit) of a record.
__device__ __forceinline__ uint32_t rec_word(const uint8_t* rec, int j) {
  return reinterpret_cast<const uint32_t*>(rec + kRecStride * (j >> 1))[j & 1];
}
// Store order x of a record (D = 64 with padding: its last half; 0 otherwise): stored channel c' is channel c' ^ x.
template <int D>
__device__ __forceinline__ uint32_t rec_order(const uint8_t* rec, int keep) {
  if constexpr (D != 64) {
    return 0u;
  } else {
    return (keep & 3) ? (rec_unit(rec, round_up(keep, 4) / 4).y >> 16) & 63u : 0u;
  }
}

// Shared-memory carve-up of the attention kernel (the launcher computes the same total).
template <int D, int GP>
struct AttnSmem {
  __half* qs;     // [D][GP]  q as given (fp16: 8-byte loads for GP = 4, fewer bank conflicts)
  float* sc;      // [GP][TS + 8] scores, then fp16-rounded probabilities
  float* red;     // [kWarps][GP]
  float* stat;    // [2][GP] block max, block sum
  float* racc;    // [kWarps][GP][D] per-warp V accumulators
  uint8_t* kst;   // [TS * rk] the split's compressed K records (cp.async at kernel start)
  uint8_t* vst;   // [TS * rv] the split's compressed V records (cp.async at kernel start)
  __half* tile;   // [kWarps][16][D + 8] dense V tile
  __device__ AttnSmem(uint8_t* base, int TS, int rk, int rv) {
    size_t o = 0;
    qs = reinterpret_cast<__half*>(base + o); o += sizeof(__half) * D * GP;
    sc = reinterpret_cast<float*>(base + o); o += sizeof(float) * GP * (TS + 8);
    red = reinterpret_cast<float*>(base + o); o += sizeof(float) * kWarps * GP;
    stat = reinterpret_cast<float*>(base + o); o += sizeof(float) * 2 * GP;
    racc = reinterpret_cast<float*>(base + o); o += sizeof(float) * kWarps * GP * D;
    o = (o + 15) / 16 * 16;
    kst = base + o; o += round_up(TS * rk, 16);
    vst = base + o; o += round_up(TS * rv, 16);
    tile = reinterpret_cast<__half*>(base + o);
  }
};

template <int GP>
__device__ __forceinline__ void load_q(const __half* qs, int c, float (&qv)[GP]) {
  if constexpr (GP >= 4) {
#pragma unroll
    for (int g = 0; g < GP; g += 4) {
      const uint2 raw = *reinterpret_cast<const uint2*>(qs + c * GP + g);
      const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
      const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
      qv[g] = a.x; qv[g + 1] = a.y; qv[g + 2] = b.x; qv[g + 3] = b.y;
    }
  } else if constexpr (GP == 2) {
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(qs + c * 2));
    qv[0] = a.x; qv[1] = a.y;
  } else {
    qv[0] = __half2float(qs[c]);
  }
}

// Channels of set bits in order, on 32-bit words (2 instructions per ffs/clear); the words still to
// visit shift through registers, so nothing is indexed dynamically. Call next() at most popcount times.
template <int NW>
struct BitIter {
  uint32_t cur, n1, n2, n3;
  int base;
  __device__ __forceinline__ void init(const uint8_t* rec, int w0 = 0) {  // bitmap words w0 .. w0 + NW - 1 of a record
    cur = rec_word(rec, w0);
    n1 = NW > 1 ? rec_word(rec, w0 + (NW > 1 ? 1 : 0)) : 0u;
    n2 = NW > 2 ? rec_word(rec, w0 + (NW > 2 ? 2 : 0)) : 0u;
    n3 = NW > 3 ? rec_word(rec, w0 + (NW > 3 ? 3 : 0)) : 0u;
    base = 0;
  }
  __device__ __forceinline__ int next() {
    while (cur == 0u) {
      cur = n1;
      if constexpr (NW > 2) { n1 = n2; n2 = n3; n3 = 0u; }
      base += 32;
    }
    const int c = __ffs(cur) - 1 + base;
    cur &= cur - 1u;
    return c;
  }
};

// ---------------------------------------------------------------------------------------------
// Decode attention, one split.
template <int D, int GP>
__device__ __forceinline__ void attn_split(
    const __half* __restrict__ q, float* __restrict__ ws, const int* __restrict__ lens,
    const uint8_t* __restrict__ k_rec, const uint8_t* __restrict__ v_rec,
    const __half* __restrict__ k_ring, const __half* __restrict__ v_ring,
    int Hkv, int G, int cap, int C, int W, int A, int keep_k, int keep_v, int rk, int rv,
    int TS, int NS, float scale_log2) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int L = lens[b];
  const int t_begin = split * TS;
  const int t_end = min(t_begin + TS, L);
  const int n = t_end - t_begin;
  if (n <= 0) return;  // the combine kernel reads only splits below ceil(L / TS)
  const int n_comp = min(n_compressed(L, W, A), cap);
  const int Hq = Hkv * G;
  const size_t bh = static_cast<size_t>(b) * Hkv + h;
  AttnSmem<D, GP> sm(smem_raw, TS, rk, rv);
  const int sstride = TS + 8;

  // Issue every compressed byte of this split at once (K group, then V group): the V records land
  // while the K scores are computed, and no warp waits on DRAM once per tile.
  // whole 16-token groups (records are chunk-major within them; t_begin is a multiple of 64, the capacity of 16)
  const int nrec_all = round_up(max(0, min(t_end, n_comp) - t_begin), 16);
  {
    const uint8_t* ksrc = k_rec + (bh * cap + t_begin) * static_cast<size_t>(rk);
    for (int i = tid; i < nrec_all * rk / 8; i += kThreads) cp_async8(sm.kst + 8 * i, ksrc + 8 * i);
    cp_async_commit();
    const uint8_t* vsrc = v_rec + (bh * cap + t_begin) * static_cast<size_t>(rv);
    for (int i = tid; i < nrec_all * rv / 8; i += kThreads) cp_async8(sm.vst + 8 * i, vsrc + 8 * i);
    cp_async_commit();
  }

  for (int i = tid; i < GP * D; i += kThreads) {
    const int g = i / D, c = i % D;
    __half v = __ushort_as_half(0);
    if (g < G) v = q[(static_cast<size_t>(b) * Hq + h * G + g) * D + c];
    sm.qs[c * GP + g] = v;
  }
  cp_async_wait<1>();
  __syncthreads();

  // ---- K: scores, one thread per token -------------------------------------------------------
  float mloc[GP];
#pragma unroll
  for (int g = 0; g < GP; ++g) mloc[g] = -INFINITY;
  for (int t = t_begin + tid; t < t_end; t += kThreads) {
    float s[GP];
#pragma unroll
    for (int g = 0; g < GP; ++g) s[g] = 0.f;
    if (t < n_comp) {
      const uint8_t* rec = sm.kst + rec_offset(t - t_begin, rk);
      BitIter<D / 32> it;
      it.init(rec);
      const int xo = static_cast<int>(rec_order<D>(rec, keep_k));  // stored channel c' is channel c' ^ xo
      for (int j = 0; j < keep_k; j += 4) {
        const uint2 raw = rec_unit(rec, D / 64 + (j >> 2));
        const __half2 h01 = *reinterpret_cast<const __half2*>(&raw.x);
        const __half2 h23 = *reinterpret_cast<const __half2*>(&raw.y);
        const float2 f01 = __half22float2(h01), f23 = __half22float2(h23);
        const float fv[4] = {f01.x, f01.y, f23.x, f23.y};
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          if (j + u < keep_k) {
            const int c = it.next() ^ xo;
            float qv[GP];
            load_q<GP>(sm.qs, c, qv);
#pragma unroll
            for (int g = 0; g < GP; ++g) s[g] = fmaf(fv[u], qv[g], s[g]);
          }
        }
      }
    } else {
      const uint4* row = reinterpret_cast<const uint4*>(k_ring + (bh * C + (t % C)) * D);
#pragma unroll 2
      for (int c8 = 0; c8 < D / 8; ++c8) {
        const uint4 raw = row[c8];
        const __half2* hp = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const float2 f = __half22float2(hp[u]);
          float qa[GP], qb[GP];
          load_q<GP>(sm.qs, c8 * 8 + 2 * u, qa);
          load_q<GP>(sm.qs, c8 * 8 + 2 * u + 1, qb);
#pragma unroll
          for (int g = 0; g < GP; ++g) s[g] = fmaf(f.y, qb[g], fmaf(f.x, qa[g], s[g]));
        }
      }
    }
#pragma unroll
    for (int g = 0; g < GP; ++g) {
      s[g] *= scale_log2;
      sm.sc[g * sstride + (t - t_begin)] = s[g];
      mloc[g] = fmaxf(mloc[g], s[g]);
    }
  }
  const int n16 = round_up(n, kTile);
  for (int i = n + tid; i < n16; i += kThreads) {
#pragma unroll
    for (int g = 0; g < GP; ++g) sm.sc[g * sstride + i] = -INFINITY;
  }
#pragma unroll
  for (int g = 0; g < GP; ++g) {
    float m = mloc[g];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) sm.red[warp * GP + g] = m;
  }
  __syncthreads();
  if (tid < GP) {
    float m = sm.red[tid];
    for (int w = 1; w < kWarps; ++w) m = fmaxf(m, sm.red[w * GP + tid]);
    sm.stat[tid] = m;
  }
  __syncthreads();
  float mg[GP], lloc[GP];
#pragma unroll
  for (int g = 0; g < GP; ++g) { mg[g] = sm.stat[g]; lloc[g] = 0.f; }
  for (int i = tid; i < n; i += kThreads) {
#pragma unroll
    for (int g = 0; g < GP; ++g) {
      // Round to fp16 here: the same value feeds the mma (A operand) and the sum l.
      const float p = __half2float(__float2half_rn(exp2f(sm.sc[g * sstride + i] - mg[g])));
      sm.sc[g * sstride + i] = p;
      lloc[g] += p;
    }
  }
  for (int i = n + tid; i < n16; i += kThreads) {
#pragma unroll
    for (int g = 0; g < GP; ++g) sm.sc[g * sstride + i] = 0.f;
  }
#pragma unroll
  for (int g = 0; g < GP; ++g) {
    float l = lloc[g];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
    if (lane == 0) sm.red[warp * GP + g] = l;
  }
  cp_async_wait<0>();
  __syncthreads();
  if (tid < GP) {
    float l = 0.f;
    for (int w = 0; w < kWarps; ++w) l += sm.red[w * GP + tid];
    sm.stat[GP + tid] = l;
  }

  // ---- V: 16-token tiles per warp, decompress to smem, P x V on tensor cores -----------------
  constexpr int NT = D / 8;     // n8 tiles over channels
  constexpr int TR = D + 8;     // padded tile row (halfs): conflict-free ldmatrix
  float acc[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  __half* tile = sm.tile + warp * kTile * TR;
  const int r = lane >> 1, half = lane & 1;   // decompression: 2 lanes per token
  const int g_row = lane >> 2, kq = lane & 3; // mma fragment coordinates
  const int ntiles = n16 / kTile;
  for (int tt = warp; tt < ntiles; tt += kWarps) {
    const int tb = t_begin + tt * kTile;
    {
      const int t = tb + r;
      __half* row = tile + r * TR + half * (D / 2);
      if (t < t_end && t < n_comp) {
        const uint8_t* rec = sm.vst + rec_offset(t - t_begin, rv);
        // Stored word `half` holds channels of the real half half ^ (xo >> 5) (D = 64; both lanes of a token have
        // the same xo, so the two still zero and fill the whole row).
        const uint32_t xo = rec_order<D>(rec, keep_v);
        row = tile + r * TR + (half ^ (xo >> 5)) * (D / 2);
        const int xl = static_cast<int>(xo & 31u);
        // Lane half 0 owns channels [0, D/2), half 1 owns [D/2, D): D/64 32-bit bitmap words each.
        constexpr int NWL = D / 64;
        int idx = 0;
        if (half) {
#pragma unroll
          for (int j = 0; j < NWL; ++j) idx += __popc(rec_word(rec, j));
        }
        BitIter<NWL> it;
        it.init(rec, half * NWL);
        int nb = 0;
#pragma unroll
        for (int j = 0; j < NWL; ++j) nb += __popc(rec_word(rec, half * NWL + j));
        uint4* row4 = reinterpret_cast<uint4*>(row);
#pragma unroll
        for (int i = 0; i < D / 16; ++i) row4[i] = make_uint4(0u, 0u, 0u, 0u);
        for (int j = 0; j < nb; ++j) {  // value idx + j: byte D / 8 + 2 (idx + j) of the record
          const int o = D / 8 + 2 * (idx + j);
          row[it.next() ^ xl] = *reinterpret_cast<const __half*>(rec + kRecStride * (o >> 3) + (o & 7));
        }
      } else if (t < t_end) {
        const uint4* src = reinterpret_cast<const uint4*>(v_ring + (bh * C + (t % C)) * D + half * (D / 2));
        uint4* row4 = reinterpret_cast<uint4*>(row);
#pragma unroll
        for (int i = 0; i < D / 16; ++i) row4[i] = src[i];
      } else {
        uint4* row4 = reinterpret_cast<uint4*>(row);
#pragma unroll
        for (int i = 0; i < D / 16; ++i) row4[i] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
    __syncwarp();
    uint32_t a[4] = {0u, 0u, 0u, 0u};
    if (g_row < GP) {
      const float* pr = sm.sc + g_row * sstride + tt * kTile + 2 * kq;
      a[0] = pack_half2(pr[0], pr[1]);
      a[2] = pack_half2(pr[8], pr[9]);
    }
    const int mi = lane >> 3, rr = lane & 7;
    const __half* lrow = tile + ((mi & 1) * 8 + rr) * TR + (mi >> 1) * 8;
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t bfr[4];
      ldmatrix_x4_trans(bfr, lrow + np * 16);
      mma16816(acc[2 * np], a, bfr[0], bfr[1]);
      mma16816(acc[2 * np + 1], a, bfr[2], bfr[3]);
    }
    __syncwarp();
  }
  if (g_row < GP) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      float* dst = sm.racc + (warp * GP + g_row) * D + nt * 8 + 2 * kq;
      dst[0] = acc[nt][0];
      dst[1] = acc[nt][1];
    }
  }
  __syncthreads();
  for (int i = tid; i < G * D; i += kThreads) {
    const int g = i / D, c = i % D;
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += sm.racc[(w * GP + g) * D + c];
    float* part = ws + ((static_cast<size_t>(b) * Hq + h * G + g) * NS + split) * (D + 2);
    part[2 + c] = v;
    if (c == 0) {
      part[0] = sm.stat[g];
      part[1] = sm.stat[GP + g];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Merge of the split partials of one query head, by a whole block of T threads (every thread calls it;
// it contains barriers). pg: ns partials (m, l, O[D]) float32 of PR = D + 2 floats, written by other
// blocks (read through L2 with ld.cg). Thread (slice j = tid / D, channel c = tid % D) sums the splits
// j, j + J, ... (J = T / D slices, loads of 4 splits in flight per step), then the slices are added in
// shared memory in a fixed order: deterministic. sred: >= T + T / D + T / 32 floats of shared memory.
// ns = 0 (empty sequence) gives zeros.
template <int D, int T>
__device__ __noinline__ void merge_splits(const float* __restrict__ pg, int ns, __half* __restrict__ dst,
                                             float* sred) {
  constexpr int PR = D + 2, J = T / D, NWARP = T / 32;
  static_assert(T % D == 0 && T % 32 == 0, "merge_splits: T must be a multiple of D and of 32");
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int c = tid % D, j = tid / D;
  float M = -INFINITY;
  for (int s = tid; s < ns; s += T) M = fmaxf(M, __ldcg(pg + static_cast<size_t>(s) * PR));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  float* wmax = sred + T + J;
  if (lane == 0) wmax[warp] = M;
  __syncthreads();
  M = wmax[0];
#pragma unroll
  for (int w = 1; w < NWARP; ++w) M = fmaxf(M, wmax[w]);
  float num = 0.f, den = 0.f;
  int s = j;
  for (; s + 3 * J < ns; s += 4 * J) {
    float mv[4], lv[4], ov[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const float* p = pg + static_cast<size_t>(s + u * J) * PR;
      mv[u] = __ldcg(p);
      lv[u] = __ldcg(p + 1);
      ov[u] = __ldcg(p + 2 + c);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const float f = exp2f(mv[u] - M);
      den = fmaf(f, lv[u], den);
      num = fmaf(f, ov[u], num);
    }
  }
  for (; s < ns; s += J) {
    const float* p = pg + static_cast<size_t>(s) * PR;
    const float f = exp2f(__ldcg(p) - M);
    den = fmaf(f, __ldcg(p + 1), den);
    num = fmaf(f, __ldcg(p + 2 + c), num);
  }
  sred[tid] = num;  // [j][c]
  if (c == 0) sred[T + j] = den;
  __syncthreads();
  if (tid < D) {
    float a = 0.f, l = 0.f;
#pragma unroll
    for (int jj = 0; jj < J; ++jj) {
      a += sred[jj * D + tid];
      l += sred[T + jj];
    }
    dst[tid] = __float2half_rn(l > 0.f ? a / l : 0.f);
  }
  __syncthreads();  // sred may be reused by the caller
}

// ---------------------------------------------------------------------------------------------
// Decode attention v2 ("warp-streaming"), one split per block of NW warps (kW2 = 4; 8 or 16 for the wide
// tactics 3, 4 at d = 64). Each warp owns the
// 16-token tiles warp, warp + NW, ... of the split and runs flash attention over them on its own:
// per tile, lanes 0-15 decompress the K records and lanes 16-31 the V records of the tile's 16 tokens
// (one lane per token, set bits scattered into a dense fp16 tile in shared memory), then
//   S[16 (GQA heads, padded) x 16 tokens] = Q . K^T   (mma.sync m16n8k16, Q fragments held in registers)
//   online softmax on the S fragments (fp32, exp2; P rounded to fp16, l summed from the same values)
//   O += P . V                                        (P fragments straight from S, no shared memory)
// Records are staged per warp with cp.async, kStages deep (no block-wide barrier inside the loop).
// The warps' (m, l, O) are merged through shared memory at the end and written as the split's
// partial result; with `fuse`, the last block of a (sequence, KV head) (atomic counter in the
// workspace, reset by that block) also merges all splits and writes the fp16 output.
constexpr int kW2 = 4;           // warps per block
constexpr int kThreads2 = 32 * kW2;
constexpr int kStages = 3;       // cp.async pipeline depth per warp

__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// exp2 of the per-tile softmax: one MUFU.EX2 (ex2.approx.ftz). exp2f adds a range check and two
// predicated multiplies per call for results below 2^-126, which the tile loop does not need: P is
// rounded to fp16 (smallest subnormal 2^-24), and a rescale factor below 2^-126 leaves the old terms
// below fp32 resolution of the new ones. Outputs were bit-identical to exp2f's on every shape timed
// (session 14, docs/sparse_kv.md).
__device__ __forceinline__ float tile_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Transpose an 8x8 b16 matrix held as mma fragments (lane l: row l / 4, columns 2 (l % 4) + {0, 1}).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// Channels of set bits in descending order: one FLO per bit (31 - clz), where ffs costs BREV + FLO
// (both on the quarter-rate pipe). Call next() at most popcount times.
template <int NW>
struct BitIterDesc {
  uint32_t cur, n1, n2, n3;
  int base;
  __device__ __forceinline__ void init(const uint8_t* rec) {  // the record's NW bitmap words
    cur = rec_word(rec, NW - 1);
    n1 = NW > 1 ? rec_word(rec, NW > 1 ? NW - 2 : 0) : 0u;
    n2 = NW > 2 ? rec_word(rec, NW > 2 ? NW - 3 : 0) : 0u;
    n3 = NW > 3 ? rec_word(rec, NW > 3 ? NW - 4 : 0) : 0u;
    base = 32 * (NW - 1);
  }
  __device__ __forceinline__ int next() {
    while (cur == 0u) {
      cur = n1;
      if constexpr (NW > 2) { n1 = n2; n2 = n3; n3 = 0u; }
      base -= 32;
    }
    const int c = 31 - __clz(cur);
    cur ^= 1u << c;
    return base + c;
  }
};

// D = 64 without a loop or branch per bit (BF): the high word is walked first, and the low word (with the row's low
// half) replaces it by selects when it runs out (the row zero-filled before): put() stores the next value at the
// highest channel left and runs at most popcount times, so an exhausted low word is never read.
__device__ __forceinline__ void zero_row64(__half* __restrict__ row) {
  uint4* row4 = reinterpret_cast<uint4*>(row);
#pragma unroll
  for (int i = 0; i < 8; ++i) row4[i] = make_uint4(0u, 0u, 0u, 0u);
}

// Over the stored bitmap of a record of store order x: stored word k holds the channels of real word k ^ (x >> 5),
// bit i of it channel i ^ (x & 31) there.
struct RowWalk64 {
  uint32_t lo, cur, xl;
  uint8_t *rlo, *rb;
  __device__ __forceinline__ RowWalk64(uint32_t lo_, uint32_t hi, __half* __restrict__ row, uint32_t x) : lo(lo_) {
    uint8_t* r0 = reinterpret_cast<uint8_t*>(row);
    xl = x & 31u;
    rlo = r0 + 64 * (x >> 5);  // the real word of stored word 0, then of stored word 1
    uint8_t* rhi = r0 + 64 - 64 * (x >> 5);
    cur = hi != 0u ? hi : lo;
    rb = hi != 0u ? rhi : rlo;
  }
  __device__ __forceinline__ void put(uint32_t v) {
    const int c = 31 - __clz(cur);
    cur ^= 1u << c;
    *reinterpret_cast<unsigned short*>(rb + 2 * (c ^ xl)) = static_cast<unsigned short>(v);
    const bool z = cur == 0u;
    cur = z ? lo : cur;
    rb = z ? rlo : rb;
  }
};

__device__ __forceinline__ void decode_row64_bf(const uint8_t* __restrict__ rec, int keep, __half* __restrict__ row) {
  zero_row64(row);
  const uint2 bm = rec_unit(rec, 0);
  RowWalk64 wk(bm.x, bm.y, row, rec_order<64>(rec, keep));
  int j = (keep - 1) & ~3;  // first value of the top (possibly partial) group of 4
  {
    const uint2 raw = rec_unit(rec, 1 + (j >> 2));
    if (j + 3 < keep) wk.put(raw.y >> 16);
    if (j + 2 < keep) wk.put(raw.y & 0xffffu);
    if (j + 1 < keep) wk.put(raw.x >> 16);
    wk.put(raw.x & 0xffffu);
  }
  for (j -= 4; j >= 0; j -= 4) {
    const uint2 raw = rec_unit(rec, 1 + (j >> 2));
    wk.put(raw.y >> 16);
    wk.put(raw.y & 0xffffu);
    wk.put(raw.x >> 16);
    wk.put(raw.x & 0xffffu);
  }
}

// d = 64, 48-byte records (keep 17-20: sparsity 0.69-0.73, the 70 % setting; the REG kernels): decode_row64_bf on
// a record held in registers, loaded by the lane itself (rload in attn2_split) instead of staged in shared memory.
// Value j is half j % 2 of word 2 + j / 2: values 16 .. keep - 1 (words 10, 11) first, then 15 .. 0 (words 9 .. 2).
__device__ __forceinline__ void decode_row64_reg(const uint4 (&r)[3], int keep, __half* __restrict__ row) {
  zero_row64(row);
  const uint32_t w[12] = {r[0].x, r[0].y, r[0].z, r[0].w, r[1].x, r[1].y, r[1].z, r[1].w,
                          r[2].x, r[2].y, r[2].z, r[2].w};
  RowWalk64 wk(w[0], w[1], row, keep < 20 ? (w[11] >> 16) & 63u : 0u);  // x: the last half (keep 17-19)
  if (19 < keep) wk.put(w[11] >> 16);
  if (18 < keep) wk.put(w[11] & 0xffffu);
  if (17 < keep) wk.put(w[10] >> 16);
  wk.put(w[10] & 0xffffu);
#pragma unroll
  for (int k = 9; k >= 2; --k) {
    wk.put(w[k] >> 16);
    wk.put(w[k] & 0xffffu);
  }
}

// The same records for the PIPE kernels (sparse_kv_attn2p_*): two independent walks instead of decode_row64_bf's one.
// Values 0..9 go to the 10 lowest set bits (ascending: the lowest bit is cur ^ (cur & (cur - 1))), values 10..keep-1
// to the others, highest first (ascending over the bit-reversed words, so channel = clz of the isolated bit). Each
// chain is cur -> IADD -> LOP3 (with the zero test) -> SEL, no FLO on it; the optional values 17..19 are predicated
// stores, so the decode is one basic block. In four parts (RegDecode64::part) so that attn2_split can splice them
// into the phases of the previous tile's multiply (session 29, docs/sparse_kv.md).
__device__ __forceinline__ void sts16_if(bool p, uint32_t addr, uint32_t v) {
  asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %0, 0;\n @q st.shared.b16 [%1], %2;\n}\n"
               :: "r"(static_cast<int>(p)), "r"(addr), "h"(static_cast<unsigned short>(v)) : "memory");
}

template <bool REV>  // REV: the words are bit-reversed
struct AscWalk64 {
  uint32_t cur, nxt, rb, rnx, xl;  // rb, rnx: shared addresses of channel 0 of the current and of the next word
  // x: the record's store order (RowWalk64); xl folds its low 5 bits into the bit position below.
  __device__ __forceinline__ void init(uint32_t first, uint32_t second, uint32_t r_first, uint32_t r_second,
                                       uint32_t x) {
    xl = REV ? x & 31u : 31u ^ (x & 31u);
    cur = first != 0u ? first : second;
    rb = first != 0u ? r_first : r_second;
    nxt = second;
    rnx = r_second;
  }
  // Store v at the next set bit (if p). Called at most popcount times in all (an exhausted second word is never read).
  template <bool PRED = false>
  __device__ __forceinline__ void put(uint32_t v, bool p = true) {
    const uint32_t nc = cur & (cur - 1u);
    const uint32_t c = __clz(cur ^ nc) ^ xl;  // REV: clz ^ x; else (31 - clz) ^ x = clz ^ (31 ^ x)
    sts16_if(!PRED || p, rb + 2 * c, v);
    const bool z = nc == 0u;
    const uint32_t nn = z ? nxt : nc;
    const uint32_t nb = z ? rnx : rb;
    cur = !PRED || p ? nn : cur;
    rb = !PRED || p ? nb : rb;
  }
};

struct RegDecode64 {
  AscWalk64<false> a;
  AscWalk64<true> bw;
  uint32_t w[12];
  int keep;
  __device__ __forceinline__ void init(const uint4 (&r)[3], int keep_, __half* __restrict__ row) {
    zero_row64(row);
    const uint32_t ww[12] = {r[0].x, r[0].y, r[0].z, r[0].w, r[1].x, r[1].y, r[1].z, r[1].w,
                             r[2].x, r[2].y, r[2].z, r[2].w};
#pragma unroll
    for (int k = 0; k < 12; ++k) w[k] = ww[k];
    keep = keep_;
    const uint32_t r0 = smem_u32(row);
    const uint32_t x = keep < 20 ? (w[11] >> 16) & 63u : 0u;  // the store order (keep 17-19: the last half)
    const uint32_t s0 = r0 + 64 * (x >> 5), s1 = r0 + 64 - 64 * (x >> 5);  // real words of stored words 0, 1
    a.init(w[0], w[1], s0, s1, x);
    bw.init(__brev(w[1]), __brev(w[0]), s1, s0, x);
  }
  __device__ __forceinline__ void part(int ph) {  // ph = 0..3 (compile-time after inlining)
    if (ph == 0) {
      bw.put<true>(w[11] >> 16, 19 < keep);
      a.put(w[2]);
      bw.put<true>(w[11], 18 < keep);
      a.put(w[2] >> 16);
      bw.put<true>(w[10] >> 16, 17 < keep);
      a.put(w[3]);
    } else if (ph == 1) {
      bw.put(w[10]);
      a.put(w[3] >> 16);
      bw.put(w[9] >> 16);
      a.put(w[4]);
      bw.put(w[9]);
      a.put(w[4] >> 16);
    } else if (ph == 2) {
      bw.put(w[8] >> 16);
      a.put(w[5]);
      bw.put(w[8]);
      a.put(w[5] >> 16);
    } else {
      bw.put(w[7] >> 16);
      a.put(w[6]);
      bw.put(w[7]);
      a.put(w[6] >> 16);
    }
  }
};

__device__ __forceinline__ void decode_row64_reg2(const uint4 (&r)[3], int keep, __half* __restrict__ row) {
  RegDecode64 dec;
  dec.init(r, keep, row);
#pragma unroll
  for (int ph = 0; ph < 4; ++ph) dec.part(ph);
}

__device__ __forceinline__ uint2 ldg_nc8(const void* p) {
  uint2 r;
  asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];\n" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}

// Scatter one compressed record into a dense fp16 row (zeros elsewhere), highest channel first.
// D = 64: decode_row64_bf; D = 128: BitIterDesc over four words.
template <int D>
__device__ __forceinline__ void decode_row_desc(const uint8_t* __restrict__ rec, int keep, __half* __restrict__ row) {
  if constexpr (D == 64) {
    decode_row64_bf(rec, keep, row);
    return;
  }
  uint4* row4 = reinterpret_cast<uint4*>(row);
#pragma unroll
  for (int i = 0; i < D / 8; ++i) row4[i] = make_uint4(0u, 0u, 0u, 0u);
  BitIterDesc<D / 32> it;
  it.init(rec);
  int j = (keep - 1) & ~3;  // first value of the top (possibly partial) group of 4
  {
    const uint2 raw = rec_unit(rec, D / 64 + (j >> 2));
    if (j + 3 < keep) row[it.next()] = __ushort_as_half(static_cast<unsigned short>(raw.y >> 16));
    if (j + 2 < keep) row[it.next()] = __ushort_as_half(static_cast<unsigned short>(raw.y & 0xffffu));
    if (j + 1 < keep) row[it.next()] = __ushort_as_half(static_cast<unsigned short>(raw.x >> 16));
    row[it.next()] = __ushort_as_half(static_cast<unsigned short>(raw.x & 0xffffu));
  }
  for (j -= 4; j >= 0; j -= 4) {
    const uint2 raw = rec_unit(rec, D / 64 + (j >> 2));
    row[it.next()] = __ushort_as_half(static_cast<unsigned short>(raw.y >> 16));
    row[it.next()] = __ushort_as_half(static_cast<unsigned short>(raw.y & 0xffffu));
    row[it.next()] = __ushort_as_half(static_cast<unsigned short>(raw.x >> 16));
    row[it.next()] = __ushort_as_half(static_cast<unsigned short>(raw.x & 0xffffu));
  }
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src));
}

// 16 bytes from src, or 16 zero bytes where !valid (src-size 0: nothing is read).
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

// Bytes of one warp's region: K and V tiles [16][D + 8] fp16, then kStages record stages.
__device__ __forceinline__ int stage_bytes(int rk, int rv) { return round_up(16 * rk, 16) + round_up(16 * rv, 16); }

// Fused merge (tactics 2-4) of one L2 round trip per pass of up to 32 splits: warp w merges heads w,
// w + NW, ...; the pass's partials (m, l, O[D]) of one head are contiguous in the workspace and are
// copied by the warp's lanes into the warp's own shared region with 8-byte cp.async (all in flight;
// .ca is safe: within a launch no other block of this SM reads these lines, and L1 starts clean per
// launch); lane s takes split s's (m, l), the head's maximum and sum by shuffles, then lane j sums the
// channels D/32 * j, ... over the pass's splits (weights by shuffle, LDS.64/128) and folds the pass
// into its running (M, den, acc) online. No barrier; fixed order: deterministic.
template <int D, int NW>
__device__ __forceinline__ void merge_last1(const float* __restrict__ part0, int ns, int NS, int G,
                                            __half* __restrict__ dst, uint8_t* wbase, int wbytes) {
  constexpr int PR = D + 2, V = D / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int cs = min(32, wbytes / (PR * 4));  // splits per pass (>= 23: see smem_bytes2)
  float* buf = reinterpret_cast<float*>(wbase);
  for (int g = warp; g < G; g += NW) {
    const float* pg = part0 + static_cast<size_t>(g) * NS * PR;
    float M = -INFINITY, den = 0.f, acc[V];
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = 0.f;
    for (int s0 = 0; s0 < ns; s0 += cs) {
      const int n = min(cs, ns - s0);
      const float* src = pg + static_cast<size_t>(s0) * PR;
      for (int e = lane; e < n * (PR / 2); e += 32) cp_async8(buf + 2 * e, src + 2 * e);
      cp_async_commit();
      cp_async_wait<0>();
      __syncwarp();
      const float ms = lane < n ? buf[lane * PR] : -INFINITY;
      const float ls = lane < n ? buf[lane * PR + 1] : 0.f;
      float mx = ms;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float Mn = fmaxf(M, mx);
      const float a = exp2f(M - Mn);   // 0 on the first pass (M = -inf)
      const float f = exp2f(ms - Mn);  // 0 for lanes without a split
      float dl = f * ls;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) dl += __shfl_xor_sync(0xffffffffu, dl, off);
      den = fmaf(den, a, dl);
      M = Mn;
#pragma unroll
      for (int v = 0; v < V; ++v) acc[v] *= a;
      const float* col = buf + 2 + V * lane;
      for (int s = 0; s < n; ++s) {
        const float fs = __shfl_sync(0xffffffffu, f, s);
        if constexpr (V == 2) {
          const float2 o = *reinterpret_cast<const float2*>(col + s * PR);
          acc[0] = fmaf(fs, o.x, acc[0]);
          acc[1] = fmaf(fs, o.y, acc[1]);
        } else {
#pragma unroll
          for (int v = 0; v < V; v += 2) {
            const float2 o = *reinterpret_cast<const float2*>(col + s * PR + v);
            acc[v] = fmaf(fs, o.x, acc[v]);
            acc[v + 1] = fmaf(fs, o.y, acc[v + 1]);
          }
        }
      }
      __syncwarp();  // buf is rewritten by the next pass
    }
    __half2* d2 = reinterpret_cast<__half2*>(dst + static_cast<size_t>(g) * D + V * lane);
#pragma unroll
    for (int v = 0; v < V / 2; ++v)
      d2[v] = den > 0.f ? __floats2half2_rn(acc[2 * v] / den, acc[2 * v + 1] / den) : __floats2half2_rn(0.f, 0.f);
  }
}

// DENSE (sparse_kv_dense2_*: the dense fp16 baseline of dense_decode_attention, tactics 1-4): the same kernel on a
// plain cache (k_ring/v_ring = [B, Hkv, C, D], token t in row t, nothing compressed). A tile's 16 K and V rows go
// by cp.async straight into the stage slot, laid out as the [16][D + 8] tiles that ldmatrix reads (rows past the
// split zero-filled), kStages deep like the records; there is no decode and no separate tile area.
template <int D, int GP, int NW, bool DENSE = false, bool REG = false, bool PIPE = false, bool PEEL = false>
__device__ __forceinline__ void attn2_split(
    const __half* __restrict__ q, float* __restrict__ ws, const int* __restrict__ lens,
    const uint8_t* __restrict__ k_rec, const uint8_t* __restrict__ v_rec,
    const __half* __restrict__ k_ring, const __half* __restrict__ v_ring,
    int Hkv, int G, int cap, int C, int W, int A, int keep_k, int keep_v, int rk, int rv,
    int NS, float scale_log2, __half* __restrict__ out, int fuse, int split, int h, int b, int L, int t_begin,
    int t_lim, int ns_work, int nbatch) {
  // One split: tokens [t_begin, min(t_lim, L)) of sequence b (L = lens[b]) and KV head h, partial slot `split` of NS;
  // with `fuse`, the block that brings the count of finished splits of (b, h) to ns_work merges them. nbatch: the
  // batch (the workspace's counters come first). attn2_entry gives the split from the grid or, stream-K, a segment.
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __shared__ int s_last;
  SKV_STAMP(0);  // block start
  constexpr int TR = D + 8;  // padded tile row (halfs): conflict-free ldmatrix
  constexpr int MT = D / 16; // m16 tiles over channels (V^T . P^T)
  constexpr int KC = D / 16; // k16 chunks over channels (Q.K^T)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int Hq = Hkv * G;
  if (fuse && L <= 0) {  // nothing cached: zeros (the only block of this (b, h) that does anything)
    if (split == 0)
      for (int i = tid; i < G * D; i += 32 * NW)
        out[(static_cast<size_t>(b) * Hq + h * G) * D + i] = __ushort_as_half(0);
    return;
  }
  const int t_end = min(t_lim, L);
  const int n = t_end - t_begin;
  if (n <= 0) return;  // the merge reads only the ns_work splits that start below L
  const int n_comp = DENSE ? 0 : min(n_compressed(L, W, A), cap);
  const int ncomp_end = min(t_end, n_comp);
  const size_t bh = static_cast<size_t>(b) * Hkv + h;
  constexpr int kTileBytes = 2 * 16 * TR * 2;  // K and V tiles [16][D + 8] fp16
  const int sb = DENSE ? kTileBytes : stage_bytes(rk, rv);
  const int kbytes = round_up(16 * rk, 16);
  const int wbytes = (DENSE ? 0 : kTileBytes) + kStages * sb;  // one warp's region (see smem_bytes2)
  uint8_t* wbase = smem_raw + static_cast<size_t>(warp) * wbytes;
  __half* kt = reinterpret_cast<__half*>(wbase);
  __half* vt = kt + 16 * TR;
  uint8_t* stages = wbase + (DENSE ? 0 : kTileBytes);

  const int ntiles = (n + 15) >> 4;
  const int cnt = ntiles > warp ? (ntiles - warp + NW - 1) / NW : 0;
  // Lean issue: a full tile's records of one cache (16 consecutive tokens) are one contiguous, 8-byte
  // aligned span of 16 r bytes, copied in 8-byte chunks lane, lane + 32, ...: per lane the source
  // pointers advance by a constant per tile, the chunk counts are fixed for the loop and the stage
  // slots rotate by addition. Tiles with window or padding rows (at most the last two of a warp) take
  // the general path.
  const uint8_t* kg = k_rec + (bh * cap + t_begin + warp * 16) * static_cast<size_t>(rk) + 8 * lane;
  const uint8_t* vg = v_rec + (bh * cap + t_begin + warp * 16) * static_cast<size_t>(rv) + 8 * lane;
  const size_t kstep = static_cast<size_t>(NW * 16) * rk, vstep = static_cast<size_t>(NW * 16) * rv;
  const int nk = (2 * rk - lane + 31) >> 5, nv = (2 * rv - lane + 31) >> 5;  // this lane's chunks
  const uint32_t st_first = smem_u32(stages) + 8 * lane, st_last = st_first + (kStages - 1) * sb;
  uint32_t st_issue = st_first;
  int ii = 0;
  // DENSE: chunk e = lane + 32 j (j < D / 8) of the tile's 2 x 16 rows x D / 8 16-byte chunks: cache e / (2 D),
  // row (e / (D / 8)) % 16, chunk e % (D / 8); per lane a source offset advanced by NW tiles per issue.
  const size_t doff0 = DENSE ? (bh * C + t_begin + warp * 16 + (lane / (D / 8))) * D + 8 * (lane % (D / 8)) : 0;
  const __half* dksrc = DENSE ? k_ring + doff0 : nullptr;
  const __half* dvsrc = DENSE ? v_ring + doff0 : nullptr;
  const size_t dstep = static_cast<size_t>(NW * 16) * D;
  const int drow0 = DENSE ? t_begin + warp * 16 + lane / (D / 8) : 0;  // token of this lane's first chunk
  auto issue_next = [&]() {  // this warp's tile ii into the next stage slot
    if constexpr (DENSE) {
      if (ii < cnt) {
        const uint32_t dst0 = st_issue - 8 * lane;  // slot base
        const int row0 = drow0 + ii * NW * 16;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
          const int e = lane + 32 * j;
          const int kv = e / (2 * D), r = (e / (D / 8)) % 16, c = e % (D / 8);
          const int rr0 = (32 * j / (D / 8)) % 16;  // row of chunk j relative to the lane's first row
          const bool ok = row0 + rr0 < t_end;
          cp_async16_zfill(dst0 + 2 * (kv * 16 * TR + r * TR + 8 * c), ok ? (kv ? dvsrc : dksrc) + rr0 * D : k_ring,
                           ok);
        }
      }
      cp_async_commit();
      ++ii;
      dksrc += dstep;
      dvsrc += dstep;
      st_issue = st_issue == st_last ? st_first : st_issue + sb;
      return;
    }
    if (!REG && ii < cnt) {
      const int tb = t_begin + (warp + ii * NW) * 16;
      if (tb + 16 <= ncomp_end) {  // warp-uniform
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (j < nk) cp_async8_u32(st_issue + 256 * j, kg + 256 * j);
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (j < nv) cp_async8_u32(st_issue + kbytes + 256 * j, vg + 256 * j);
        if (rk > 64 || rv > 64) {  // more than 4 chunks for some lane (sparsity < 56 % at d = 64)
#pragma unroll 1
          for (int j = 4; j < nk; ++j) cp_async8_u32(st_issue + 256 * j, kg + 256 * j);
#pragma unroll 1
          for (int j = 4; j < nv; ++j) cp_async8_u32(st_issue + kbytes + 256 * j, vg + 256 * j);
        }
      } else {  // rare (code size matters more than speed here); a group's records are spread over all of it
        const int nrec = ncomp_end > tb ? 16 : 0;
#pragma unroll 1
        for (int e = lane; e < nrec * rk / 8; e += 32) cp_async8_u32(st_issue - 8 * lane + 8 * e, kg - 8 * lane + 8 * e);
#pragma unroll 1
        for (int e = lane; e < nrec * rv / 8; e += 32)
          cp_async8_u32(st_issue - 8 * lane + kbytes + 8 * e, vg - 8 * lane + 8 * e);
      }
    }
    cp_async_commit();
    ++ii;
    kg += kstep;
    vg += vstep;
    st_issue = st_issue == st_last ? st_first : st_issue + sb;
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue_next();

  // Q^T fragments (B operand of S^T = K . Q^T: k = channels, n = query heads; heads >= G are zero).
  const int g_row = lane >> 2, q4 = lane & 3;
  uint32_t qb[KC][2];
  {
    const uint32_t* qrow = reinterpret_cast<const uint32_t*>(q + (static_cast<size_t>(b) * Hq + h * G + g_row) * D);
#pragma unroll
    for (int kc = 0; kc < KC; ++kc) {
      qb[kc][0] = g_row < G ? qrow[kc * 8 + q4] : 0u;
      qb[kc][1] = g_row < G ? qrow[kc * 8 + 4 + q4] : 0u;
    }
  }
  // O^T accumulators: acc[mt] = O^T[channels 16 mt + g_row (+8)][heads 2 q4, 2 q4 + 1].
  float acc[MT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};  // heads 2 q4, 2 q4 + 1

  const int dr = lane & 15;
  const bool dv = lane >= 16;  // decode role: lanes 0-15 K rows, 16-31 V rows
  __half* drow = (dv ? vt : kt) + dr * TR;
  const int dkeep = dv ? keep_v : keep_k;
  const int doff = dv ? kbytes + 8 * dr : 8 * dr;  // this lane's record in a slot (chunk-major records)
  const __half* dring = (dv ? v_ring : k_ring) + bh * C * D;
  // REG (48-byte records on 16-byte aligned arrays, the launcher checks both): this lane's record of tiles i, i + 1,
  // i + 2 in registers (PIPE: of tiles i + 1, i + 2), six 8-byte loads per tile (units 0-5, chunk-major).
  const uint8_t* rsrc = (dv ? v_rec : k_rec) + rec_offset(bh * cap + t_begin + warp * 16 + dr, rk);
  auto rload = [&](int ii, uint4 (&r)[3]) {
    if (REG && ii < cnt && t_begin + (warp + ii * NW) * 16 + dr < ncomp_end) {
      const uint8_t* src = rsrc + static_cast<size_t>(ii) * NW * 16 * rk;
#pragma unroll
      for (int j = 0; j < 3; ++j) {  // units 2 j, 2 j + 1 of the record: 128 contiguous bytes per load over 16 lanes
        const uint2 lo = ldg_nc8(src + 2 * j * kRecStride), hi = ldg_nc8(src + (2 * j + 1) * kRecStride);
        r[j] = make_uint4(lo.x, lo.y, hi.x, hi.y);
      }
    }
  };
  uint4 ra[3] = {}, rb2[3] = {}, rc[3] = {};
  if constexpr (REG) {
    rload(0, ra);
    rload(1, rb2);
  }
  const int mi = lane >> 3, rr = lane & 7;
  const __half* krow = kt + ((mi & 1) * 8 + rr) * TR + (mi >> 1) * 8;  // ldmatrix: A = K [tokens x channels]
  const __half* vrow = vt + ((mi >> 1) * 8 + rr) * TR + (mi & 1) * 8;  // ldmatrix.trans: A = V^T [channels x tokens]

  const uint8_t* st_dec = stages + doff;  // this lane's record in the slot of tile i
  const __half* kslot = DENSE ? reinterpret_cast<const __half*>(stages) : nullptr;  // DENSE: the slot of tile i
  // PIPE: multiply the tile of tokens tb.. whose K, V tiles start at `tiles`; with `splice` (a constant at each call),
  // the decode of the next tile's record (`rec`) into `next_row` runs in four parts between the phases (the source
  // order is the issue order of the shared-memory operations). Not a generic lambda: NVRTC compiles those as host code.
  RegDecode64 dec;
  auto compute_tile = [&](int tb, const __half* tiles, bool splice, __half* next_row, const uint4 (&rec)[3]) {
    // S^T[16 tokens x 8 heads] = K Q^T: s[0..1] token tb + g_row, s[2..3] token tb + g_row + 8; heads 2 q4 + {0, 1}.
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int kc = 0; kc < KC; ++kc) {
      uint32_t ak[4];
      ldmatrix_x4(ak, tiles + (krow - kt) + kc * 16);
      mma16816(s, ak, qb[kc][0], qb[kc][1]);
    }
    if (splice) {
      dec.init(rec, dkeep, next_row);
      dec.part(0);
    }
    const bool ok0 = tb + g_row < t_end, ok1 = tb + g_row + 8 < t_end;
    s[0] = ok0 ? s[0] * scale_log2 : -INFINITY;
    s[1] = ok0 ? s[1] * scale_log2 : -INFINITY;
    s[2] = ok1 ? s[2] * scale_log2 : -INFINITY;
    s[3] = ok1 ? s[3] * scale_log2 : -INFINITY;
    float mt0 = fmaxf(s[0], s[2]), mt1 = fmaxf(s[1], s[3]);
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      mt0 = fmaxf(mt0, __shfl_xor_sync(0xffffffffu, mt0, o));
      mt1 = fmaxf(mt1, __shfl_xor_sync(0xffffffffu, mt1, o));
    }
    if (splice) dec.part(1);
    const float mn0 = fmaxf(m_run[0], mt0), mn1 = fmaxf(m_run[1], mt1);
    const float al0 = tile_exp2(m_run[0] - mn0), al1 = tile_exp2(m_run[1] - mn1);
    m_run[0] = mn0;
    m_run[1] = mn1;
    // P rounded to fp16: the same values feed the mma and l.
    const __half2 p01 = __floats2half2_rn(tile_exp2(s[0] - mn0), tile_exp2(s[1] - mn1));  // token g_row
    const __half2 p23 = __floats2half2_rn(tile_exp2(s[2] - mn0), tile_exp2(s[3] - mn1));  // token g_row + 8
    const float2 f01 = __half22float2(p01), f23 = __half22float2(p23);
    l_run[0] = fmaf(l_run[0], al0, f01.x + f23.x);
    l_run[1] = fmaf(l_run[1], al1, f01.y + f23.y);
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      acc[m][0] *= al0; acc[m][1] *= al1; acc[m][2] *= al0; acc[m][3] *= al1;
    }
    // B operand of O^T += V^T P^T: P^T[tokens 2 q4, +1 (+8)][head g_row], transposed in registers.
    const uint32_t pb0 = movmatrix_trans(*reinterpret_cast<const uint32_t*>(&p01));
    const uint32_t pb1 = movmatrix_trans(*reinterpret_cast<const uint32_t*>(&p23));
    const uint32_t pb[2] = {pb0, pb1};
    if (splice) dec.part(2);
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      uint32_t av[4];
      ldmatrix_x4_trans(av, tiles + (vrow - kt) + m * 16);
      mma16816(acc[m], av, pb[0], pb[1]);
    }
    if (splice) dec.part(3);
  };
  if constexpr (PIPE) {
    static_assert(REG && D == 64, "PIPE: REG kernels only");
    // Tiles double-buffered: REG does not use the record stages, whose 3 x 1536 bytes (48-byte records) hold the second
    // K, V tile pair. Tile i + 1 is decoded while tile i is multiplied: its decode is spliced into tile i's phases, so
    // the decode's ALU chains fill the latency of the multiply's shared-memory loads, mma and shuffles.
    constexpr int KB = kTileBytes / 2;  // halfs
    auto decode_tile = [&](int i, const uint4 (&r)[3], int boff) -> bool {  // true: window rows in flight
      const int tb = t_begin + (warp + i * NW) * 16;
      const int t = tb + dr;
      __half* row = drow + boff;
      if (t < ncomp_end) {
        decode_row64_reg2(r, dkeep, row);
      } else if (t < t_end) {  // dense window row: all of it in flight at once
        const __half* src = dring + static_cast<size_t>(t % C) * D;
#pragma unroll
        for (int e = 0; e < D / 8; ++e) cp_async16(row + 8 * e, src + 8 * e);
      } else {
        uint4* row4 = reinterpret_cast<uint4*>(row);
#pragma unroll
        for (int e = 0; e < D / 8; ++e) row4[e] = make_uint4(0u, 0u, 0u, 0u);
      }
      return tb + 16 > ncomp_end;  // warp-uniform
    };
    // Two record buffers (session 32): ra holds the record decoded during the current tile's multiply, rb2 the one
    // loading; a third (session 29's) bought no latency, since the move into rb2 waited for its load anyway, and it
    // held the first multiply until three tiles' records had arrived. Loads by a pointer advanced per tile.
    const size_t rstep = static_cast<size_t>(NW) * 16 * rk;
    const uint8_t* rp = rsrc + 2 * rstep;
    int trow = t_begin + (warp + 2 * NW) * 16 + dr;  // row < ncomp_end implies the tile is one of this warp's (< cnt)
    auto rnext = [&](uint4 (&r)[3]) {  // this lane's record of the warp's tile 2, 3, ... (one per call)
      if (trow < ncomp_end) {
#pragma unroll
        for (int j = 0; j < 3; ++j) {
          const uint2 lo = ldg_nc8(rp + 2 * j * kRecStride), hi = ldg_nc8(rp + (2 * j + 1) * kRecStride);
          r[j] = make_uint4(lo.x, lo.y, hi.x, hi.y);
        }
      }
      rp += rstep;
      trow += NW * 16;
    };
    // PEEL (session 34: GP >= 2 and not stream-K; the g1 kernels measured 0.97-0.99x with it, so they keep the move):
    // tile 0 peeled, tile 1's record stays in rb2 and tile 2's loads into ra, so tile 0's multiply starts without
    // waiting for tile 1's record (the move ra = rb2 does); the loop then finds tile 2's record in ra as it expects.
    constexpr bool kPeel = PEEL;
    if (cnt > 0 && !kPeel) {
      if (decode_tile(0, ra, 0)) { cp_async_commit(); cp_async_wait<0>(); }
      SKV_STAMP(8);  // warp 0: first tile decoded (its records arrived), before the buffers move
#pragma unroll
      for (int e = 0; e < 3; ++e) ra[e] = rb2[e];
      __syncwarp();
      SKV_STAMP(1);  // warp 0: first tile's records arrived and decoded
    }
    if (cnt > 0 && kPeel) {
      if (decode_tile(0, ra, 0)) { cp_async_commit(); cp_async_wait<0>(); }
      SKV_STAMP(8);  // warp 0: first tile decoded (its records arrived)
      __syncwarp();
      SKV_STAMP(1);  // warp 0: first tile's records arrived and decoded
      rnext(ra);
      bool window = false;
      if (cnt > 1 && t_begin + (warp + NW) * 16 + 16 <= ncomp_end) {  // warp-uniform: all compressed
        compute_tile(t_begin + warp * 16, kt, true, drow + KB, rb2);
      } else {
        if (cnt > 1) window = decode_tile(1, rb2, KB);
        compute_tile(t_begin + warp * 16, kt, false, nullptr, rb2);
      }
      if (window) { cp_async_commit(); cp_async_wait<0>(); }
      __syncwarp();
    }
    for (int i = kPeel ? 1 : 0; i < cnt; ++i) {  // tile i is in pair i % 2; ra holds tile i + 1's record
      rnext(rb2);  // tile i + 2's
      const int bcur = (i & 1) * KB;
      bool window = false;
      if (i + 1 < cnt && t_begin + (warp + (i + 1) * NW) * 16 + 16 <= ncomp_end) {  // warp-uniform: all compressed
        compute_tile(t_begin + (warp + i * NW) * 16, kt + bcur, true, drow + KB - bcur, ra);
      } else {
        if (i + 1 < cnt) window = decode_tile(i + 1, ra, KB - bcur);
        compute_tile(t_begin + (warp + i * NW) * 16, kt + bcur, false, nullptr, ra);
      }
      if (window) { cp_async_commit(); cp_async_wait<0>(); }
#pragma unroll
      for (int e = 0; e < 3; ++e) ra[e] = rb2[e];
      __syncwarp();
    }
  }
  if constexpr (!PIPE)  // the loop as before session 29 (the SASS of these kernels unchanged)
  for (int i = 0; i < cnt; ++i) {
    issue_next();
    if constexpr (REG) rload(i + 2, rc);
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const int tb = t_begin + (warp + i * NW) * 16;
    if constexpr (!DENSE) {
      const int t = tb + dr;
      if (t < ncomp_end) {
        if constexpr (REG) decode_row64_reg(ra, dkeep, drow);
        else decode_row_desc<D>(st_dec, dkeep, drow);
      } else if (t < t_end) {  // dense window row: all of it in flight at once
        const __half* src = dring + static_cast<size_t>(t % C) * D;
#pragma unroll
        for (int e = 0; e < D / 8; ++e) cp_async16(drow + 8 * e, src + 8 * e);
      } else {
        uint4* row4 = reinterpret_cast<uint4*>(drow);
#pragma unroll
        for (int e = 0; e < D / 8; ++e) row4[e] = make_uint4(0u, 0u, 0u, 0u);
      }
      if (tb + 16 > ncomp_end) {  // warp-uniform: this tile has window rows (or padding)
        cp_async_commit();
        cp_async_wait<0>();
      }
    }
    __syncwarp();
#ifdef SKV_TIMELINE
    if (i == 0) SKV_STAMP(1);  // warp 0: first tile's records arrived and decoded (DENSE: its rows arrived)
#endif
    // S^T[16 tokens x 8 heads] = K Q^T: s[0..1] token tb + g_row, s[2..3] token tb + g_row + 8; heads 2 q4 + {0, 1}.
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int kc = 0; kc < KC; ++kc) {
      uint32_t ak[4];
      ldmatrix_x4(ak, (DENSE ? kslot + (krow - kt) : krow) + kc * 16);
      mma16816(s, ak, qb[kc][0], qb[kc][1]);
    }
    const bool ok0 = tb + g_row < t_end, ok1 = tb + g_row + 8 < t_end;
    s[0] = ok0 ? s[0] * scale_log2 : -INFINITY;
    s[1] = ok0 ? s[1] * scale_log2 : -INFINITY;
    s[2] = ok1 ? s[2] * scale_log2 : -INFINITY;
    s[3] = ok1 ? s[3] * scale_log2 : -INFINITY;
    float mt0 = fmaxf(s[0], s[2]), mt1 = fmaxf(s[1], s[3]);
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      mt0 = fmaxf(mt0, __shfl_xor_sync(0xffffffffu, mt0, o));
      mt1 = fmaxf(mt1, __shfl_xor_sync(0xffffffffu, mt1, o));
    }
    const float mn0 = fmaxf(m_run[0], mt0), mn1 = fmaxf(m_run[1], mt1);
    const float al0 = tile_exp2(m_run[0] - mn0), al1 = tile_exp2(m_run[1] - mn1);
    m_run[0] = mn0;
    m_run[1] = mn1;
    // P rounded to fp16: the same values feed the mma and l.
    const __half2 p01 = __floats2half2_rn(tile_exp2(s[0] - mn0), tile_exp2(s[1] - mn1));  // token g_row
    const __half2 p23 = __floats2half2_rn(tile_exp2(s[2] - mn0), tile_exp2(s[3] - mn1));  // token g_row + 8
    const float2 f01 = __half22float2(p01), f23 = __half22float2(p23);
    l_run[0] = fmaf(l_run[0], al0, f01.x + f23.x);
    l_run[1] = fmaf(l_run[1], al1, f01.y + f23.y);
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      acc[m][0] *= al0; acc[m][1] *= al1; acc[m][2] *= al0; acc[m][3] *= al1;
    }
    // B operand of O^T += V^T P^T: P^T[tokens 2 q4, +1 (+8)][head g_row], transposed in registers.
    const uint32_t pb0 = movmatrix_trans(*reinterpret_cast<const uint32_t*>(&p01));
    const uint32_t pb1 = movmatrix_trans(*reinterpret_cast<const uint32_t*>(&p23));
    const uint32_t pb[2] = {pb0, pb1};
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      uint32_t av[4];
      ldmatrix_x4_trans(av, (DENSE ? kslot + (vrow - kt) : vrow) + m * 16);
      mma16816(acc[m], av, pb[0], pb[1]);
    }
    st_dec = st_dec == stages + doff + (kStages - 1) * sb ? stages + doff : st_dec + sb;
    if constexpr (REG) {
#pragma unroll
      for (int e = 0; e < 3; ++e) { ra[e] = rb2[e]; rb2[e] = rc[e]; }
    }
    if constexpr (DENSE) kslot = reinterpret_cast<const uint8_t*>(kslot) == stages + (kStages - 1) * sb
                ? reinterpret_cast<const __half*>(stages)
                : reinterpret_cast<const __half*>(reinterpret_cast<const uint8_t*>(kslot) + sb);
    __syncwarp();
  }
  cp_async_wait<0>();
  SKV_STAMP(2);  // warp 0: its tiles done
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) {
    l_run[0] += __shfl_xor_sync(0xffffffffu, l_run[0], o);
    l_run[1] += __shfl_xor_sync(0xffffffffu, l_run[1], o);
  }
  __syncwarp();
  // Per-warp partial (m, l, O[D]) for heads < GP, in this warp's tile area.
  constexpr int PR = D + 2;
  float* wr = reinterpret_cast<float*>(wbase);
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int g = 2 * q4 + e;
    if (g < GP) {
      if (g_row == 0) { wr[g * PR] = m_run[e]; wr[g * PR + 1] = l_run[e]; }
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        wr[g * PR + 2 + 16 * m + g_row] = acc[m][e];
        wr[g * PR + 2 + 16 * m + g_row + 8] = acc[m][2 + e];
      }
    }
  }
  __syncthreads();
  SKV_STAMP(3);  // every warp's tiles done
  const size_t wstride = wbytes / 4;  // floats between warp regions
  // Workspace: uint32 counters[round_up(B * Hq, 4)] (fused merge), then the split partials.
  unsigned int* counters = reinterpret_cast<unsigned int*>(ws);
  float* part0 = ws + round_up(nbatch * Hq, 4) + (static_cast<size_t>(b) * Hq + h * G) * NS * PR;  // head g, split s: (g * NS + s) * PR
  // The only split of (b, h) that starts below L (one split per pair, or a short sequence): the block merge writes the
  // output itself, no partial, hand-over or merge. Same bits as merge_last1 with one split (its weight exp2(0) = 1,
  // den = l, acc = O).
  const bool direct = fuse && ns_work == 1;
  __half* dst = out + (static_cast<size_t>(b) * Hq + h * G) * D;
  for (int e = tid; e < G * D; e += 32 * NW) {
    const int g = e / D, c = e % D;
    const float* w0 = reinterpret_cast<const float*>(smem_raw) + g * PR;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < NW; ++w) M = fmaxf(M, w0[w * wstride]);
    float lsum = 0.f, a = 0.f;
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      const float f = exp2f(w0[w * wstride] - M);
      lsum = fmaf(f, w0[w * wstride + 1], lsum);
      a = fmaf(f, w0[w * wstride + 2 + c], a);
    }
    if (direct) {
      dst[e] = lsum > 0.f ? __float2half_rn(a / lsum) : __float2half_rn(0.f);
      continue;
    }
    float* part = part0 + (static_cast<size_t>(g) * NS + split) * PR;
    part[2 + c] = a;
    if (c == 0) { part[0] = M; part[1] = lsum; }
  }
  SKV_STAMP(4);  // thread 0's share of the block merge done, partials issued (direct: output stores issued)
  if (!fuse || direct) return;
  // Last block of this (b, h) merges all splits. One acquire-release add by thread 0 between two barriers orders
  // every thread's partial stores before the count (release, cumulative through the barrier) and the last block's
  // merge loads after all the others' (acquire, then the barrier): CUTLASS's semaphore pattern, in place of a
  // __threadfence by every thread on both sides.
  __syncthreads();
  const int ns = ns_work;
  if (tid == 0) {
    unsigned int old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(old) : "l"(counters + bh) : "memory");
    s_last = old == static_cast<unsigned int>(ns - 1);
  }
  __syncthreads();
  SKV_STAMP(5);  // hand-over done (the counter's atomic returned)
  if (!s_last) return;
  merge_last1<D, NW>(part0, ns, NS, G, out + (static_cast<size_t>(b) * Hq + h * G) * D, wbase, wbytes);
  SKV_STAMP(6);  // last block: merge done, output stores issued
  if (tid == 0) counters[bh] = 0u;  // ready for the next call (CUDA-graph replays)
}

// The streaming kernels' entry. !SK: one split per block, grid (splits, Hkv, B), TS tokens per split (sk unused).
// SK (the _sk kernels: stream-K, tactic 5; fused merge; 16 warps; sk = B): grid (nb, 1, 1) over the sk * Hkv
// (sequence, KV head) pairs of -TS tiles each (max_len / 16 rounded up). Block i takes tiles [i T / nb, (i + 1) T / nb)
// of the T = sk Hkv (-TS) tiles of all pairs in a row, as one segment per pair it touches (one wave of equal work,
// whatever the pair count; NS = the most segments of a pair). A segment is a split of its pair (slot: the block's
// index from the pair's first block); the merge counts the segments that start below the pair's length.
template <int D, int GP, int NW, bool DENSE = false, bool REG = false, bool PIPE = false, bool SK = false>
__device__ __forceinline__ void attn2_entry(
    const __half* __restrict__ q, float* __restrict__ ws, const int* __restrict__ lens,
    const uint8_t* __restrict__ k_rec, const uint8_t* __restrict__ v_rec,
    const __half* __restrict__ k_ring, const __half* __restrict__ v_ring,
    int Hkv, int G, int cap, int C, int W, int A, int keep_k, int keep_v, int rk, int rv,
    int TS, int NS, float scale_log2, __half* __restrict__ out, int fuse, int sk) {
  if constexpr (!SK) {
    const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int L = lens[b];
    attn2_split<D, GP, NW, DENSE, REG, PIPE, PIPE && GP >= 2>(q, ws, lens, k_rec, v_rec, k_ring, v_ring, Hkv, G, cap,
                                                              C, W, A, keep_k, keep_v, rk, rv, NS, scale_log2, out,
                                                              fuse, split, h, b, L, split * TS, split * TS + TS,
                                                              min(NS, (L + TS - 1) / TS), gridDim.z);
  } else {
    const long long tpp = -TS, T = static_cast<long long>(sk) * Hkv * tpp, nb = gridDim.x, blk = blockIdx.x;
    const long long g1 = (blk + 1) * T / nb;
    for (long long g = blk * T / nb; g < g1;) {
      const int pair = static_cast<int>(g / tpp);
      const long long p0 = pair * tpp, e = min(g1, p0 + tpp);
      const int b = pair / Hkv, h = pair % Hkv;
      const int L = lens[b];
      const long long first = ((p0 + 1) * nb - 1) / T;  // the block holding the pair's first tile
      const long long work = min(static_cast<long long>((L + 15) / 16), tpp);  // tiles below L
      const int ns_work = L > 0 ? static_cast<int>(((p0 + work) * nb - 1) / T - first + 1) : 0;
      __syncthreads();  // the previous segment's shared memory
      attn2_split<D, GP, NW, DENSE, REG, PIPE>(q, ws, lens, k_rec, v_rec, k_ring, v_ring, Hkv, G, cap, C, W, A,
                                               keep_k, keep_v, rk, rv, NS, scale_log2, out, fuse,
                                               static_cast<int>(blk - first), h, b, L, static_cast<int>(16 * (g - p0)),
                                               static_cast<int>(16 * (e - p0)), ns_work, sk);
      g = e;
    }
  }
}

// Split merge, one block of kCombThreads per (sequence, query head), splits spread over the threads.
constexpr int kCombThreads = 256;
template <int D>
__device__ __forceinline__ void combine(const float* __restrict__ ws, const int* __restrict__ lens,
                                        __half* __restrict__ out, int Hq, int TS, int NS) {
  __shared__ float sred[kCombThreads + kCombThreads / D + kCombThreads / 32];
  const int bq = blockIdx.x, b = bq / Hq;
  const int L = lens[b];
  const int ns = L > 0 ? min(NS, (L + TS - 1) / TS) : 0;
  merge_splits<D, kCombThreads>(ws + static_cast<size_t>(bq) * NS * (D + 2), ns, out + static_cast<size_t>(bq) * D,
                                sred);
}

// ---------------------------------------------------------------------------------------------
// Compression of one token by one warp: keep the `keep` largest |x| (ties: lower channel first).
template <int D>
__device__ __forceinline__ void compress_token(const __half* __restrict__ src, uint8_t* __restrict__ dst,
                                               int keep, int kp) {
  constexpr int E = D / 32;
  const int lane = threadIdx.x & 31;
  const uint32_t lt = (1u << lane) - 1u;
  __half x[E];
  uint32_t key[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    x[e] = src[e * 32 + lane];
    key[e] = __half_as_ushort(x[e]) & 0x7fffu;
  }
  uint32_t tau = 0;
#pragma unroll 1
  for (int bit = 14; bit >= 0; --bit) {
    const uint32_t cand = tau | (1u << bit);
    uint32_t cnt = 0;
#pragma unroll
    for (int e = 0; e < E; ++e) cnt += key[e] >= cand;
    if (static_cast<int>(__reduce_add_sync(0xffffffffu, cnt)) >= keep) tau = cand;
  }
  uint32_t gt = 0;
#pragma unroll
  for (int e = 0; e < E; ++e) gt += key[e] > tau;
  const int need = keep - static_cast<int>(__reduce_add_sync(0xffffffffu, gt));
  bool kf[E];
  uint32_t km[E];
  int tie_before = 0;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const uint32_t tm = __ballot_sync(0xffffffffu, key[e] == tau);
    kf[e] = key[e] > tau || (key[e] == tau && tie_before + __popc(tm & lt) < need);
    tie_before += __popc(tm);
    km[e] = __ballot_sync(0xffffffffu, kf[e]);
  }
  if (lane < D / 64) {
    uint64_t w = 0;
#pragma unroll
    for (int j = 0; j < D / 64; ++j)
      if (j == lane) w = static_cast<uint64_t>(km[2 * j]) | (static_cast<uint64_t>(km[2 * j + 1]) << 32);
    *reinterpret_cast<uint64_t*>(dst + kRecStride * lane) = w;  // bitmap word `lane` is unit `lane`
  }
  // value v: byte D / 8 + 2 v of the record, i.e. unit (D / 8 + 2 v) / 8 (dst: the record, chunk-major)
  auto val = [&](int v) {
    const int o = D / 8 + 2 * v;
    return reinterpret_cast<__half*>(dst + kRecStride * (o >> 3) + (o & 7));
  };
  int before = 0;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    if (kf[e]) *val(before + __popc(km[e] & lt)) = x[e];
    before += __popc(km[e]);
  }
  if (lane < kp - keep) *val(keep + lane) = __ushort_as_half(0);
}

template <int D>
__device__ __forceinline__ void copy_row(const __half* __restrict__ src, __half* __restrict__ dst) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int e = 0; e < D / 32; ++e) dst[e * 32 + lane] = src[e * 32 + lane];
}

// ---------------------------------------------------------------------------------------------
// Store order of d = 64 records (format: the last half holds x; stored channel c' is channel c' ^ x). The pipelined
// kernels decode the 16 K records of a 16-token tile (lanes 0-15, tile row = token % 16) and its 16 V records (lanes
// 16-31) together, one value per lane and store instruction (RegDecode64's order, kStoreSteps); a store takes as many
// shared-memory wavefronts as its busiest bank has stores. In token order, K then V, each record takes the even x
// that adds the fewest wavefronts to the tile's records before it (ties: the smaller x). The numpy twin is
// edgesdk.formats.sparse_kv.schedule_records.
constexpr int kStoreSteps = 20;

// Banks of the 20 stores of a record (stored bitmap bm, order x) decoded into tile row `row` (-1: no store). Step
// 2 k stores value 19 - k (the descending walk; only values < keep), step 2 k + 1 value k (the ascending walk).
__device__ __forceinline__ void store_banks64(uint64_t bm, uint32_t x, int keep, int row, int (&bk)[kStoreSteps]) {
  uint64_t up = bm, dn = bm;
#pragma unroll
  for (int k = 0; k < 10; ++k) {
    if (19 - k < keep) {
      const int c = 63 - __clzll(dn);
      dn ^= 1ull << c;
      bk[2 * k] = (4 * row + ((c ^ static_cast<int>(x)) >> 1)) & 31;
    } else {
      bk[2 * k] = -1;
    }
    const int c = __ffsll(up) - 1;
    up &= up - 1ull;
    bk[2 * k + 1] = (4 * row + ((c ^ static_cast<int>(x)) >> 1)) & 31;
  }
}

// Bit c' of the result = bit c' ^ x of bm (swaps of adjacent 2^k-bit blocks for the set bits k of x).
__device__ __forceinline__ uint64_t xor_permute64(uint64_t bm, uint32_t x) {
  constexpr uint64_t kMask[6] = {0x5555555555555555ull, 0x3333333333333333ull, 0x0F0F0F0F0F0F0F0Full,
                                 0x00FF00FF00FF00FFull, 0x0000FFFF0000FFFFull, 0x00000000FFFFFFFFull};
#pragma unroll
  for (int k = 0; k < 6; ++k)
    if ((x >> k) & 1u) bm = ((bm >> (1 << k)) & kMask[k]) | ((bm & kMask[k]) << (1 << k));
  return bm;
}

// A 16-token tile's records compressed by one block of kCompWarps warps (warp w: token t0 + w): tokens [lo, hi) of
// the tile at t0 (a multiple of 16) of (b, h) row `bh`, from the rows kb + r D, vb + r D (r = t, or t % C with a
// ring of C > 0 slots); tokens [t0, lo) are records already. With `sched` (D = 64, K and V records of 48 bytes) the
// new records get their store order: compressed into shared memory (the group's chunk-major layout), every warp
// computes the banks of its two records under each candidate x (lane l: x = 2 l), warp 0 picks the orders in token
// order (K, then V) against the stores counted so far, then each warp rewrites its records and copies them out.
// Block-uniform arguments; every thread of the block calls this.
template <int D>
__device__ __forceinline__ void compress_tile(const __half* __restrict__ kb, const __half* __restrict__ vb, int C,
                                              uint8_t* __restrict__ k_rec, uint8_t* __restrict__ v_rec, size_t bh,
                                              int cap, int t0, int lo, int hi, int keep_k, int keep_v, int rk, int rv,
                                              bool sched) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = t0 + warp, i = t - t0;
  const bool mine = t >= lo && t < hi;
  const size_t row = static_cast<size_t>(C > 0 ? t % C : t) * D;
  if (D != 64 || !sched) {
    if (mine) {
      compress_token<D>(kb + row, k_rec + rec_offset(bh * cap + t, rk), keep_k, (rk - D / 8) / 2);
      compress_token<D>(vb + row, v_rec + rec_offset(bh * cap + t, rv), keep_v, (rv - D / 8) / 2);
    }
    return;
  }
  constexpr int R = 48, KP = (R - 8) / 2;
  __shared__ __align__(16) uint8_t s_grp[2][16 * R];  // this tile's K and V records, chunk-major as in memory
  __shared__ uint32_t s_bank[2 * 16][32][kStoreSteps / 4];  // record 2 i + kv, candidate lane: 20 banks (int8)
  __shared__ int s_cnt[kStoreSteps * 32];
  __shared__ uint8_t s_x[2 * 16];
  uint8_t* const grp_k = k_rec + rec_offset(bh * cap + t0, R);  // the tile's group in memory
  uint8_t* const grp_v = v_rec + rec_offset(bh * cap + t0, R);
  for (int e = threadIdx.x; e < kStoreSteps * 32; e += blockDim.x) s_cnt[e] = 0;
  if (mine) {
    compress_token<64>(kb + row, s_grp[0] + 8 * i, keep_k, KP);
    compress_token<64>(vb + row, s_grp[1] + 8 * i, keep_v, KP);
  }
  __syncthreads();
  if (t < lo && lane < 2) {  // a record scheduled before: its stores count
    const uint8_t* rec = (lane ? grp_v : grp_k) + 8 * i;
    const int keep = lane ? keep_v : keep_k;
    int bk[kStoreSteps];
    store_banks64(*reinterpret_cast<const uint64_t*>(rec), rec_order<64>(rec, keep), keep, i, bk);
#pragma unroll
    for (int s = 0; s < kStoreSteps; ++s)
      if (bk[s] >= 0) atomicAdd(s_cnt + 32 * s + bk[s], 1);
  } else if (mine) {
#pragma unroll
    for (int kv = 0; kv < 2; ++kv) {
      const uint64_t bm = *reinterpret_cast<const uint64_t*>(s_grp[kv] + 8 * i);
      const uint32_t x = 2u * lane;
      int bk[kStoreSteps];
      store_banks64(xor_permute64(bm, x), x, kv ? keep_v : keep_k, i, bk);
#pragma unroll
      for (int j = 0; j < kStoreSteps / 4; ++j)
        s_bank[2 * i + kv][lane][j] = (bk[4 * j] & 0xff) | (bk[4 * j + 1] & 0xff) << 8 | (bk[4 * j + 2] & 0xff) << 16 |
                                      static_cast<uint32_t>(bk[4 * j + 3] & 0xff) << 24;
    }
  }
  __syncthreads();
  if (warp == 0) {  // the greedy choice, record by record, all in registers: lane j holds bank j's counts
    int cnt[kStoreSteps], peak[kStoreSteps];
#pragma unroll
    for (int s = 0; s < kStoreSteps; ++s) {
      cnt[s] = s_cnt[32 * s + lane];
      int m = cnt[s];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
      peak[s] = m;
    }
    // A store adds a wavefront where its bank's count equals the step's peak (counts never exceed it). The winner's
    // such steps (mask mw) raise the peaks; its banks (from s_bank) the counts.
    auto unpack = [](const uint32_t* w, int (&bk)[kStoreSteps]) {
#pragma unroll
      for (int j = 0; j < kStoreSteps / 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) bk[4 * j + e] = static_cast<int8_t>((w[j] >> (8 * e)) & 0xffu);
    };
    for (int r = 2 * (lo - t0); r < 2 * (hi - t0); ++r) {
      int bk[kStoreSteps];
      unpack(s_bank[r][lane], bk);
      int added = 0;
      uint32_t m = 0u;
#pragma unroll
      for (int s = 0; s < kStoreSteps; ++s) {
        const int hit = __shfl_sync(0xffffffffu, cnt[s], bk[s] & 31);  // this candidate's bank's count at step s
        const bool on = bk[s] >= 0 && hit >= peak[s];
        added += on;
        m |= static_cast<uint32_t>(on) << s;
      }
      const uint32_t best = __reduce_min_sync(0xffffffffu, (static_cast<uint32_t>(added) << 6) | (2u * lane)) & 63u;
      const uint32_t mw = __shfl_sync(0xffffffffu, m, best >> 1);
      int wb[kStoreSteps];
      unpack(s_bank[r][best >> 1], wb);
#pragma unroll
      for (int s = 0; s < kStoreSteps; ++s) {
        cnt[s] += wb[s] == lane;
        peak[s] += (mw >> s) & 1u;
      }
      if (lane == 0) s_x[r] = static_cast<uint8_t>(best);
    }
  }
  __syncthreads();
  if (!mine) return;
#pragma unroll
  for (int kv = 0; kv < 2; ++kv) {  // the record in order x: lane l moves the values of channels l and l + 32
    uint8_t* rec = s_grp[kv] + 8 * i;
    const uint32_t x = s_x[2 * i + kv];
    auto val = [&](int v) {
      const int o = 8 + 2 * v;
      return reinterpret_cast<unsigned short*>(rec + kRecStride * (o >> 3) + (o & 7));
    };
    if (x != 0u) {
      const uint64_t bm = *reinterpret_cast<const uint64_t*>(rec), pbm = xor_permute64(bm, x);
      unsigned short vv[2];
      int dst[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = lane + 32 * e;
        const bool kept = (bm >> c) & 1ull;
        dst[e] = kept ? __popcll(pbm & ((1ull << (c ^ x)) - 1ull)) : -1;
        vv[e] = kept ? *val(__popcll(bm & ((1ull << c) - 1ull))) : 0;
      }
      __syncwarp();
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (dst[e] >= 0) *val(dst[e]) = vv[e];
      if (lane == 0) {
        *reinterpret_cast<uint64_t*>(rec) = pbm;
        *val(KP - 1) = static_cast<unsigned short>(x);
      }
    }
  }
  __syncwarp();
  if (lane < 2 * R / 8) {  // unit u of the K (lanes 0-5) or V (6-11) record out, 8 bytes
    const int kv = lane / (R / 8), u = lane % (R / 8);
    *reinterpret_cast<uint2*>((kv ? grp_v : grp_k) + kRecStride * u + 8 * i) =
        *reinterpret_cast<const uint2*>(s_grp[kv] + kRecStride * u + 8 * i);
  }
}

template <int D>
__device__ __forceinline__ void prefill(
    const __half* __restrict__ k_src, const __half* __restrict__ v_src, int S, const int* __restrict__ lens,
    uint8_t* __restrict__ k_rec, uint8_t* __restrict__ v_rec, __half* __restrict__ k_ring,
    __half* __restrict__ v_ring, int Hkv, int cap, int C, int W, int A, int keep_k, int keep_v, int rk, int rv,
    int sched) {
  // Block: the 16-token tile blockIdx.x of (b, h); warp w: its token w.
  const int t0 = blockIdx.x * kCompWarps, t = t0 + (threadIdx.x >> 5), h = blockIdx.y, b = blockIdx.z;
  const int L = min(lens[b], S);
  const int n_comp = min(n_compressed(L, W, A), cap);
  const size_t bh = static_cast<size_t>(b) * Hkv + h;
  if (t < L && t >= n_compressed(L, W, A)) {
    copy_row<D>(k_src + (bh * S + t) * D, k_ring + (bh * C + t % C) * D);
    copy_row<D>(v_src + (bh * S + t) * D, v_ring + (bh * C + t % C) * D);
  }
  if (t0 < n_comp)  // block-uniform
    compress_tile<D>(k_src + bh * S * D, v_src + bh * S * D, 0, k_rec, v_rec, bh, cap, t0, t0,
                     min(t0 + kCompWarps, n_comp), keep_k, keep_v, rk, rv, sched != 0);
}

template <int D>
__device__ __forceinline__ void append(
    const __half* __restrict__ k_new, const __half* __restrict__ v_new, const int* __restrict__ lens,
    uint8_t* __restrict__ k_rec, uint8_t* __restrict__ v_rec, __half* __restrict__ k_ring,
    __half* __restrict__ v_ring, int Hkv, int cap, int C, int W, int A, int keep_k, int keep_v, int rk, int rv,
    unsigned* __restrict__ counters, int n_counters, int sched) {
  // The node's one-token call (run_node, S = 1) zeroes the fused merge's counters here (TensorRT's scratch holds
  // anything on entry); the attention launched after this on the same stream uses them. n_counters = 0 otherwise.
  if (n_counters > 0 && (blockIdx.x | blockIdx.y | blockIdx.z) == 0)
    for (int t = threadIdx.x; t < n_counters; t += blockDim.x) counters[t] = 0u;
  const int h = blockIdx.y, b = blockIdx.z;
  const int L = lens[b];
  if (L <= 0) return;  // block-uniform
  const size_t bh = static_cast<size_t>(b) * Hkv + h;
  if (blockIdx.x == 0 && threadIdx.x < 32) {
    copy_row<D>(k_new + bh * D, k_ring + (bh * C + (L - 1) % C) * D);
    copy_row<D>(v_new + bh * D, v_ring + (bh * C + (L - 1) % C) * D);
  }
  // Compress the oldest A window tokens [g0, g0 + A) when this token fills the window to W + A: block i takes those
  // in the i-th 16-token tile they touch. They are not the new token's slot (W >= 1), so no race with the copy.
  if (L < W + A || (L - W) % A != 0) return;  // block-uniform
  const int g0 = L - W - A;
  const int t0 = (g0 / kCompWarps + static_cast<int>(blockIdx.x)) * kCompWarps;
  const int lo = max(g0, t0), hi = min(min(L - W, cap), t0 + kCompWarps);
  if (lo >= hi) return;  // block-uniform
  compress_tile<D>(k_ring + bh * C * D, v_ring + bh * C * D, C, k_rec, v_rec, bh, cap, t0, lo, hi, keep_k, keep_v,
                   rk, rv, sched > 0 && L >= sched);  // sched: schedule from this length on (0: never)
}

}  // namespace

#define ATTN_ARGS                                                                                      \
  const __half *q, float *ws, const int *lens, const uint8_t *k_rec, const uint8_t *v_rec,            \
      const __half *k_ring, const __half *v_ring, int Hkv, int G, int cap, int C, int W, int A,        \
      int keep_k, int keep_v, int rk, int rv, int TS, int NS, float scale_log2
#define ATTN_PASS q, ws, lens, k_rec, v_rec, k_ring, v_ring, Hkv, G, cap, C, W, A, keep_k, keep_v, rk, rv, TS, NS, scale_log2

#define DEF_ATTN(D, GP)                                                                                \
  extern "C" __global__ void __launch_bounds__(kThreads, D == 64 ? 3 : 2) sparse_kv_attn_d##D##_g##GP(ATTN_ARGS) {     \
    attn_split<D, GP>(ATTN_PASS);                                                                      \
  }
DEF_ATTN(64, 1)
DEF_ATTN(64, 2)
DEF_ATTN(64, 4)
DEF_ATTN(64, 8)
DEF_ATTN(128, 1)
DEF_ATTN(128, 2)
DEF_ATTN(128, 4)
DEF_ATTN(128, 8)

#define DEF_ATTN2(D, GP)                                                                               \
  extern "C" __global__ void __launch_bounds__(kThreads2, D == 64 ? 6 : 3) sparse_kv_attn2_d##D##_g##GP(     \
      ATTN_ARGS, __half* out, int fuse, int sk) {                                                       \
    attn2_entry<D, GP, kW2>(ATTN_PASS, out, fuse, sk);                                                 \
  }
DEF_ATTN2(64, 1)
DEF_ATTN2(64, 2)
DEF_ATTN2(64, 4)
DEF_ATTN2(64, 8)
DEF_ATTN2(128, 1)
DEF_ATTN2(128, 2)
DEF_ATTN2(128, 4)
DEF_ATTN2(128, 8)

// The same kernel with NW = 8 or 16 warps per block (d = 64): a split of 16 NW k tokens has NW warps
// walking k tiles each, so low-batch calls get more tiles in flight per split and fewer splits to merge.
#define DEF_ATTN2W(D, GP, NW)                                                                          \
  extern "C" __global__ void __launch_bounds__(32 * NW, 24 / NW) sparse_kv_attn2_d##D##_g##GP##_w##NW(    \
      ATTN_ARGS, __half* out, int fuse, int sk) {                                                       \
    attn2_entry<D, GP, NW>(ATTN_PASS, out, fuse, sk);                                                  \
  }
DEF_ATTN2W(64, 1, 8)
DEF_ATTN2W(64, 2, 8)
DEF_ATTN2W(64, 4, 8)
DEF_ATTN2W(64, 8, 8)
DEF_ATTN2W(64, 1, 16)
DEF_ATTN2W(64, 2, 16)
DEF_ATTN2W(64, 4, 16)
DEF_ATTN2W(64, 8, 16)
// Stream-K (tactic 5, see attn2_entry): the 16-warp kernels over equal shares of all pairs' tiles.
#define DEF_ATTN2SK(KIND, GP, DENSE, REG, PIPE)                                                          \
  extern "C" __global__ void __launch_bounds__(512, 1) sparse_kv_##KIND##_d64_g##GP##_w16_sk(ATTN_ARGS, __half* out, \
                                                                                              int fuse, int sk) {  \
    attn2_entry<64, GP, 16, DENSE, REG, PIPE, true>(ATTN_PASS, out, fuse, sk);                          \
  }
#define DEF_ATTN2SK4(KIND, DENSE, REG, PIPE) \
  DEF_ATTN2SK(KIND, 1, DENSE, REG, PIPE)     \
  DEF_ATTN2SK(KIND, 2, DENSE, REG, PIPE)     \
  DEF_ATTN2SK(KIND, 4, DENSE, REG, PIPE)     \
  DEF_ATTN2SK(KIND, 8, DENSE, REG, PIPE)
DEF_ATTN2SK4(attn2, false, false, false)
DEF_ATTN2SK4(attn2r, false, true, false)
DEF_ATTN2SK4(attn2p, false, true, true)
DEF_ATTN2SK4(dense2, true, false, false)

// 16-warp blocks with each lane's record in registers (REG; d = 64, 48-byte records; see decode_row64_reg):
// 123 registers, the 16 warps an SM holds anyway at one block per SM, so the staging's shared-memory traffic goes
// without losing warps (with 4- or 8-warp blocks it would cost a third of them: those stay staged).
#define DEF_ATTN2R(GP)                                                                                   \
  extern "C" __global__ void __launch_bounds__(512, 1) sparse_kv_attn2r_d64_g##GP##_w16(ATTN_ARGS, __half* out,  \
                                                                                          int fuse, int sk) {  \
    attn2_entry<64, GP, 16, false, true>(ATTN_PASS, out, fuse, sk);                                    \
  }
DEF_ATTN2R(1)
DEF_ATTN2R(2)
DEF_ATTN2R(4)
DEF_ATTN2R(8)
// The same, pipelined over two tile pairs (PIPE, session 29): 123-124 registers; faster from about 6 tiles per warp.
#define DEF_ATTN2P(GP)                                                                                   \
  extern "C" __global__ void __launch_bounds__(512, 1) sparse_kv_attn2p_d64_g##GP##_w16(ATTN_ARGS, __half* out,  \
                                                                                          int fuse, int sk) {  \
    attn2_entry<64, GP, 16, false, true, true>(ATTN_PASS, out, fuse, sk);                              \
  }
DEF_ATTN2P(1)
DEF_ATTN2P(2)
DEF_ATTN2P(4)
DEF_ATTN2P(8)

// The dense fp16 baseline (dense_decode_attention, tactics 1-4): the streaming kernels above on a plain cache.
#define DEF_DENSE2(D, GP, NW, SUF, MINB)                                                               \
  extern "C" __global__ void __launch_bounds__(32 * NW, MINB) sparse_kv_dense2_d##D##_g##GP##SUF(        \
      ATTN_ARGS, __half* out, int fuse, int sk) {                                                       \
    attn2_entry<D, GP, NW, true>(ATTN_PASS, out, fuse, sk);                                            \
  }
DEF_DENSE2(64, 1, 4, , 6)
DEF_DENSE2(64, 2, 4, , 6)
DEF_DENSE2(64, 4, 4, , 6)
DEF_DENSE2(64, 8, 4, , 6)
DEF_DENSE2(128, 1, 4, , 3)
DEF_DENSE2(128, 2, 4, , 3)
DEF_DENSE2(128, 4, 4, , 3)
DEF_DENSE2(128, 8, 4, , 3)
DEF_DENSE2(64, 1, 8, _w8, 3)
DEF_DENSE2(64, 2, 8, _w8, 3)
DEF_DENSE2(64, 4, 8, _w8, 3)
DEF_DENSE2(64, 8, 8, _w8, 3)
DEF_DENSE2(64, 1, 16, _w16, 1)
DEF_DENSE2(64, 2, 16, _w16, 1)
DEF_DENSE2(64, 4, 16, _w16, 1)
DEF_DENSE2(64, 8, 16, _w16, 1)

#define CACHE_ARGS                                                                                     \
  const int *lens, uint8_t *k_rec, uint8_t *v_rec, __half *k_ring, __half *v_ring, int Hkv, int cap,  \
      int C, int W, int A, int keep_k, int keep_v, int rk, int rv
#define CACHE_PASS lens, k_rec, v_rec, k_ring, v_ring, Hkv, cap, C, W, A, keep_k, keep_v, rk, rv

#define DEF_D(D)                                                                                       \
  extern "C" __global__ void __launch_bounds__(kCombThreads) sparse_kv_combine_d##D(const float* ws,     \
                                                                                const int* lens, __half* out, \
                                                                                int Hq, int TS, int NS) {     \
    combine<D>(ws, lens, out, Hq, TS, NS);                                                             \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(kCompThreads) sparse_kv_prefill_d##D(                      \
      const __half* k_src, const __half* v_src, int S, CACHE_ARGS, int sched) {                       \
    prefill<D>(k_src, v_src, S, CACHE_PASS, sched);                                                    \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(kCompThreads) sparse_kv_append_d##D(                       \
      const __half* k_new, const __half* v_new, CACHE_ARGS, unsigned* counters, int n_counters,       \
      int sched) {                                                                                     \
    append<D>(k_new, v_new, CACHE_PASS, counters, n_counters, sched);                                  \
  }
DEF_D(64)
DEF_D(128)

// ---- The EdgeSparseKVAttention node's steps (edgesdk.kernels.sparse_kv.run_node): a call of S new tokens runs S
// decode steps. Everything stays on the device (no host read of the lengths; CUDA-graph safe). A call of one token
// needs neither kernel below: its lengths are the cached lengths, and append zeroes the merge counters.

// Step i of a node call of S > 1 tokens, in one launch: lens[b] = lengths[b] + i + 1 - S (the cached length at step
// i; lengths = tokens cached after the call) and, on the first step, the fused merge's counters zeroed (TensorRT's
// scratch holds anything on entry; the fused kernel leaves them zero after each use); token i of q, k, v
// ([B, H, S, d]) into the workspace rows q_ws, k_ws, v_ws ([B, H, d]); and, from the second step on, the previous
// step's output row o_ws back into out at token i - 1 (the last step's is copied by sparse_kv_token_copy after it).
// One grid-stride loop over the five parts; 8-byte moves (d = 64 or 128). The stream orders it after the previous
// step's attention (which read the rows and wrote o_ws) and before this step's.
extern "C" __global__ void __launch_bounds__(128) sparse_kv_node_step(
    const int* lengths, int* lens, int batch, unsigned* counters, int n_counters, const __half* q, const __half* k,
    const __half* v, __half* out, __half* q_ws, __half* k_ws, __half* v_ws, const __half* o_ws, int rows_q,
    int rows_kv, int d, int S, int i) {
  const int per_row = d / 4;
  const long long n0 = max(batch, i == 0 ? n_counters : 0), nq = (long long)rows_q * per_row,
                  nkv = (long long)rows_kv * per_row;
  const long long n = n0 + nq + 2 * nkv + (i > 0 ? nq : 0);
  const long long pitch = (long long)S * d;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x) {
    if (e < n0) {
      if (e < batch) lens[e] = lengths[e] + i + 1 - S;
      if (i == 0 && e < n_counters) counters[e] = 0u;
      continue;
    }
    long long x = e - n0;
    const __half* src;
    __half* dst;
    int tok;
    bool back = false;
    if (x < nq) {
      src = q, dst = q_ws, tok = i;
    } else if ((x -= nq) < nkv) {
      src = k, dst = k_ws, tok = i;
    } else if ((x -= nkv) < nkv) {
      src = v, dst = v_ws, tok = i;
    } else {
      x -= nkv, src = o_ws, dst = out, tok = i - 1, back = true;
    }
    const long long r = x / per_row, c = (x % per_row) * 4;
    const long long s_off = back ? r * d + c : r * pitch + (long long)tok * d + c;
    const long long d_off = back ? r * pitch + (long long)tok * d + c : r * d + c;
    *reinterpret_cast<uint2*>(dst + d_off) = *reinterpret_cast<const uint2*>(src + s_off);
  }
}

// rows of d halves from src (row pitch src_stride halves) to dst (row pitch dst_stride): token i of
// [B, H, S, d] to [B, H, d] (src_stride = S d) and back (dst_stride = S d). d is 64 or 128: 8-byte moves.
extern "C" __global__ void __launch_bounds__(128) sparse_kv_token_copy(const __half* src, __half* dst, int rows,
                                                                      int d, long long src_stride,
                                                                      long long dst_stride) {
  const int per_row = d / 4;
  const long long n = (long long)rows * per_row;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x) {
    const long long r = e / per_row, c = (e % per_row) * 4;
    *reinterpret_cast<uint2*>(dst + r * dst_stride + c) = *reinterpret_cast<const uint2*>(src + r * src_stride + c);
  }
}
