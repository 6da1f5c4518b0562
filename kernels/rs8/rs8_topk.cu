// rs8: exact per-row top-k for the sparse-attention indexer (decode rows).
//
// Contract: vLLM's `_C::top_k_per_row_decode` (see README.md), with one
// canonical output order: key descending under the float32 total bit order
// (+0.0 above -0.0, positive NaN above +inf, negative NaN below -inf), then
// lower position first.  The output is therefore a pure function of the input.
//
// Design (README.md has the long form): one thread-block cluster of 8 blocks
// per row (4 or 2 when there are too many rows for one wave).  Each block owns
// a contiguous slice of the row and keeps up to kCache keys of it in shared
// memory (the rest, the "tail", is re-read from L2 when needed).  Pass 0 builds
// a 1024-bin histogram of a coarse monotone bucket of the keys; the cluster
// finds the bucket holding the k-th key from 32 group sums and 32 bins read
// through distributed shared memory (DSMEM).  Normally every entry at or above
// that bucket is then a candidate; otherwise radix passes over the open key
// range (and, on exact ties, over inverted positions) narrow the cut to exactly
// k entries.  Each block sorts its own candidates as (key, ~position)
// composites, pulls the other blocks' sorted lists through DSMEM, and writes
// each index at its rank.  No host sync, no allocation, no global scratch: a
// single launch that CUDA graphs can capture.
//
// One source for sm_90a (H100/H200) and sm_120 (RTX 50xx): shared memory per
// block stays under SM120's 99 KB opt-in limit.

#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace cg = cooperative_groups;

namespace rs8 {
// Internal linkage throughout: two builds (say, the -DRS8_BREAK test build) can
// live in one process without sharing template statics (GNU unique symbols).
namespace {

constexpr int kCluster = 8;       // blocks per row (fewer when many rows; see launch)
constexpr int kThreads = 1024;    // threads per block
constexpr int kDigitBits = 10;    // radix digit width
constexpr int kBins = 1 << kDigitBits;
constexpr int kSmemLimit = 101376;  // SM120: 99 KB opt-in per block

// Per-k shared-memory plan.  aux holds the two histogram buffers during the
// radix passes and is reused for the k broadcast candidates afterwards.
template <int K>
struct Plan {
  static constexpr int kAuxBytes = (2 * kBins * 4 > 8 * K) ? 2 * kBins * 4 : 8 * K;
  static constexpr int kMiscBytes = 1472;
  static constexpr int kCache = ((kSmemLimit - kAuxBytes - kMiscBytes) / 4) & ~15;
  static constexpr int kSmemBytes = kCache * 4 + kAuxBytes + kMiscBytes;
  static_assert(kSmemBytes <= kSmemLimit, "shared memory plan exceeds SM120's limit");
  static_assert(K % kCluster == 0 && kThreads % (K / kCluster) == 0, "bad k");
};

// K=512 and K=1024 give 22,928 cached keys per block (183,424 per cluster).
static_assert(Plan<512>::kCache == 22928, "cache size changed");

// Small per-block state.  `list` holds the chunk offsets of the entries that
// are at or above the cutoff bucket (found by the first refine pass), so later
// passes and the gather touch ~100 entries instead of the whole chunk.
constexpr int kListCap = 288;
#ifdef RS8_TIMING
// Stage clocks of row 0's blocks (timing build only): [block][stage].
__device__ long long g_rs8_clock[kCluster][16];
#define RS8_MARK(st)                                                   \
  do {                                                                  \
    if (row == 0 && tid == 0) g_rs8_clock[rank][st] = clock64();        \
  } while (0)
#else
#define RS8_MARK(st) \
  do {               \
  } while (0)
#endif

struct Misc {
  unsigned int counter;   // block 0's: next free candidate slot (cluster-wide)
  unsigned int digit;     // result of the current pass
  unsigned int above;
  unsigned int cnt;
  unsigned int nlist;     // entries appended to list (may exceed kListCap)
  unsigned int nloc;      // this block's selected entries (may exceed kLocalCap)
  unsigned int pad[2];
  unsigned int nq[kCluster];  // every block's nloc
  unsigned int gsum[2][32];  // per-pass group sums of the bins (double-buffered)
  unsigned int list[kListCap];
};
static_assert(sizeof(Misc) <= 1472, "Misc must fit the plan's misc bytes");

// Float32 bits -> unsigned key whose unsigned order is the float total order.
__device__ __forceinline__ unsigned int to_key(unsigned int u) {
#ifdef RS8_BREAK
  // Deliberately wrong build for the test suite: -0.0 collapses onto +0.0.
  if (u == 0x80000000u) u = 0u;
#endif
  // Negative: flip every bit; non-negative: set the sign bit (branch-free).
  return u ^ (static_cast<unsigned int>(static_cast<int>(u) >> 31) | 0x80000000u);
}

__device__ __forceinline__ float load_f(const float* p) { return __ldg(p); }

// Coarse pass-0 bucket: a monotone map of the key onto 1024 bins with 16 bins
// per octave for |x| in [2^-14, 2^18) (like fp16's top bits), saturating
// outside.  It spreads typical logits over many bins (few atomic conflicts);
// exactness never depends on it because later passes refine inside a bucket.
constexpr unsigned int kELo = 113u;  // exponent of 2^-14
__device__ __forceinline__ unsigned int mag_bin(unsigned int u) {  // u: |x| bits
  if (u < (kELo << 23)) return 0u;
  const unsigned int b = (u - (kELo << 23)) >> 19;
  return b > 511u ? 511u : b;
}
__device__ __forceinline__ unsigned int bucket(unsigned int k) {
  return (k & 0x80000000u) ? 512u + mag_bin(k & 0x7fffffffu) : 511u - mag_bin(0x7fffffffu - k);
}
__device__ __forceinline__ unsigned int mag_lo(unsigned int b) {
  return b == 0u ? 0u : (kELo << 23) + (b << 19);
}
__device__ __forceinline__ unsigned int mag_hi(unsigned int b) {
  return b >= 511u ? 0x7fffffffu : (kELo << 23) + ((b + 1u) << 19) - 1u;
}
// Smallest and largest key of a bucket.
__device__ __forceinline__ unsigned int bucket_lo(unsigned int b) {
  return b >= 512u ? 0x80000000u + mag_lo(b - 512u) : 0x7fffffffu - mag_hi(511u - b);
}
__device__ __forceinline__ unsigned int bucket_hi(unsigned int b) {
  return b >= 512u ? 0x80000000u + mag_hi(b - 512u) : 0x7fffffffu - mag_lo(511u - b);
}

// Pass 0 counts only keys above +0.0's bucket (negatives, zeros and tiny
// values are most of a row and never in its top k unless the row has fewer
// than k larger keys; then the pass is redone with every key, see below).
constexpr unsigned int kLowMax = 512u;
__device__ __forceinline__ void count_high(unsigned int* h, unsigned int k) {
  const unsigned int b = bucket(k);
  if (b > kLowMax) atomicAdd(&h[b], 1u);
}
// Same as count_high(h, to_key(u)) straight from the float bits u, in a few
// instructions: bucket > 512 exactly when u, as a signed int, is at least
// 0x38880000 (a positive float with (u >> 19) - 1808 >= 1), and then
// bucket = 512 + min((u >> 19) - 1808, 511).
__device__ __forceinline__ void count_high_bits(unsigned int* h, unsigned int u) {
  if (static_cast<int>(u) >= 0x38880000) {
    const unsigned int b = (u >> 19) - 1296u;
    atomicAdd(&h[b < 1023u ? b : 1023u], 1u);
  }
}

__device__ __forceinline__ void store_and_count(float4 q, int i, unsigned int* cache,
                                                unsigned int* h, int cap) {
  uint4 kk;
  kk.x = to_key(__float_as_uint(q.x));
  kk.y = to_key(__float_as_uint(q.y));
  kk.z = to_key(__float_as_uint(q.z));
  kk.w = to_key(__float_as_uint(q.w));
  if (i < cap) *reinterpret_cast<uint4*>(cache + i) = kk;  // cap is a multiple of 4
#ifdef RS8_P0_NOHIST
  return;  // timing variant only: load + cache without the histogram
#endif
  count_high_bits(h, __float_as_uint(q.x));
  count_high_bits(h, __float_as_uint(q.y));
  count_high_bits(h, __float_as_uint(q.z));
  count_high_bits(h, __float_as_uint(q.w));
}

// Key of chunk entry i: from the shared-memory cache, or re-read (tail).
__device__ __forceinline__ unsigned int key_at(int i, int ncache, const unsigned int* cache,
                                               const float* chunk, long long stride1) {
  return (i < ncache) ? cache[i]
                      : to_key(__float_as_uint(load_f(chunk + static_cast<long long>(i) * stride1)));
}

// Inclusive suffix sum inside a warp: lane i gets sum of lanes >= i.
__device__ __forceinline__ unsigned int warp_suffix_incl(unsigned int x, int lane) {
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    unsigned int y = __shfl_down_sync(0xffffffffu, x, off);
    if (lane + off < 32) x += y;
  }
  return x;
}

template <int K, int CL>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(kThreads, 1)
    topk_decode_kernel(const float* __restrict__ logits, long long stride0, long long stride1,
                       long long ncols, const int* __restrict__ seq_lens, int seq_2d, int next_n,
                       int* __restrict__ indices) {
  using P = Plan<K>;
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned int* cache = reinterpret_cast<unsigned int*>(smem);
  unsigned int* hist0 = reinterpret_cast<unsigned int*>(smem + P::kCache * 4);
  unsigned long long* cand = reinterpret_cast<unsigned long long*>(smem + P::kCache * 4);
  Misc* misc = reinterpret_cast<Misc*>(smem + P::kCache * 4 + P::kAuxBytes);
#ifdef RS8_EXTRA_SYNCS
  for (int x = 0; x < RS8_EXTRA_SYNCS; ++x) cg::this_cluster().sync();  // timing variant
#endif
#ifdef RS8_EXTRA_BARS
  for (int x = 0; x < RS8_EXTRA_BARS; ++x) __syncthreads();  // timing variant
#endif

  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int row = blockIdx.x / CL;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;

  // Row length (rowStart is always 0 for decode rows).
  long long L;
  if (seq_2d) {
    L = seq_lens[row];
  } else {
    L = static_cast<long long>(seq_lens[row / next_n]) - next_n + (row % next_n) + 1;
  }
  if (L < 0) L = 0;
  if (L > ncols) L = ncols;
  int* out = indices + static_cast<long long>(row) * K;

  constexpr int kShare = K / CL;
  constexpr int kCap = P::kAuxBytes / 8;  // candidate slots in aux
  if (L <= K) {
    // Short row: 0..L-1 then -1.  No DSMEM, so blocks may leave independently.
    for (int s = rank * kShare + tid; s < (rank + 1) * kShare; s += kThreads)
      out[s] = (s < L) ? s : -1;
    return;
  }

  const int Li = static_cast<int>(L);
  const int cs = (((Li + CL - 1) / CL) + 3) & ~3;  // chunk, multiple of 4
  const int start = rank * cs;
  int n = Li - start;
  n = n < 0 ? 0 : (n > cs ? cs : n);
  const int ncache = n < P::kCache ? n : P::kCache;
  const float* rowp = logits + static_cast<long long>(row) * stride0;
  const float* chunk = rowp + static_cast<long long>(start) * stride1;

  RS8_MARK(0);
  // ---- pass 0: load, cache, histogram of the coarse bucket ------------------
  unsigned int* hA = hist0;
  unsigned int* hB = hist0 + kBins;
  for (int i = tid; i < kBins; i += kThreads) hA[i] = 0;
  if (tid == 0) {
    misc->counter = 0;
    misc->nlist = 0;
    misc->nloc = 0;
  }
  __syncthreads();

  const bool vec = (stride1 == 1) && ((reinterpret_cast<uintptr_t>(chunk) & 15) == 0);
#ifdef RS8_PREFETCH  // measured no gain on the H200 (NOTES.md): off by default
  if (vec) {
    // Ask L2 for the whole chunk at once (bulk prefetch, no registers or
    // shared memory); the loads below then mostly hit L2, which lets one SM
    // pull its chunk much faster than DRAM latency would allow.
    constexpr int kPiece = 16384;  // bytes per prefetch instruction
    const int bytes = (n >> 2) * 16;
    for (int off = tid * kPiece; off < bytes; off += kThreads * kPiece) {
      const int len = (bytes - off) < kPiece ? (bytes - off) : kPiece;
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(
                       reinterpret_cast<const char*>(chunk) + off),
                   "r"(len)
                   : "memory");
    }
  }
#endif
  if (vec) {
    const float4* src = reinterpret_cast<const float4*>(chunk);
    const int nv = n >> 2;
    // Every thread issues all its loads of a round before using any, so the
    // whole cached chunk is in flight at once (one DRAM round trip, not six).
    constexpr int kU = 6;
    for (int v = tid; v < nv; v += kU * kThreads) {
      float4 q[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u)
        if (v + u * kThreads < nv) q[u] = __ldg(src + v + u * kThreads);
#pragma unroll
      for (int u = 0; u < kU; ++u)
        if (v + u * kThreads < nv)
          store_and_count(q[u], (v + u * kThreads) * 4, cache, hA, P::kCache);
    }
    for (int i = nv * 4 + tid; i < n; i += kThreads) {
      const unsigned int k = to_key(__float_as_uint(load_f(chunk + i)));
      if (i < P::kCache) cache[i] = k;
      count_high(hA, k);
    }
  } else {
    for (int i = tid; i < n; i += kThreads) {
      const unsigned int k =
          to_key(__float_as_uint(load_f(chunk + static_cast<long long>(i) * stride1)));
      if (i < P::kCache) cache[i] = k;
      count_high(hA, k);
    }
  }

#if defined(RS8_STAGE) && RS8_STAGE == 1
  cluster.sync();  // timing variant: load + bucket histogram only
  return;
#endif
  // Selection state, identical in every block of the cluster.  Keys above hi
  // are selected, keys below lo rejected, [lo, hi] is still open.  Once the
  // open range is one key, the same is done on inverted positions [plo, phi].
  unsigned int lo = 0, hi = 0xffffffffu;
  unsigned int plo = 0;
  unsigned int phi = 0;
  unsigned int krem = K;
  const int posbits = 32 - __clz(static_cast<unsigned int>(Li - 1));
  const unsigned int posmax = (posbits >= 32) ? 0xffffffffu : ((1u << posbits) - 1u);
  int phase = 0;  // 0: bucket pass done next, 1: key passes, 2: position passes
  int shift = 0;
#ifdef RS8_NO_LIST
  constexpr bool kList = false;
#else
  constexpr bool kList = true;
#endif
  unsigned int ncand = K;   // candidates the gather collects (K, or more on the fast path)
  bool make_list = false;  // this refine pass builds the list
  bool use_list = false;   // later passes and the gather walk the list

  RS8_MARK(1);  // pass 0 done in this block
  bool redo0 = false;  // pass 0 must be redone counting every key
  int par = 0;         // pass parity: which group-sum buffer this pass uses
  for (;;) {
    if (redo0) {
      for (int i = tid; i < kBins; i += kThreads) hA[i] = 0;
      __syncthreads();
      for (int i = tid; i < n; i += kThreads)
        atomicAdd(&hA[bucket(key_at(i, ncache, cache, chunk, stride1))], 1u);
    } else if (phase != 0) {
      // Histogram of the next digit among the still-open entries.
      for (int i = tid; i < kBins; i += kThreads) hA[i] = 0;
      __syncthreads();
      const unsigned int span = hi - lo;
      const unsigned int pspan = phi - plo;
      if (use_list) {
        const int m = static_cast<int>(misc->nlist);
        for (int j = tid; j < m; j += kThreads) {
          const int i = static_cast<int>(misc->list[j]);
          const unsigned int k = key_at(i, ncache, cache, chunk, stride1);
          if (phase == 1) {
            const unsigned int r = k - lo;
            if (r <= span) atomicAdd(&hA[r >> shift], 1u);
          } else {
            const unsigned int r = (posmax - static_cast<unsigned int>(start + i)) - plo;
            if (k == lo && r <= pspan) atomicAdd(&hA[r >> shift], 1u);
          }
        }
      } else if (phase == 1) {
        // Full scan; the first one also lists the entries at or above lo.
#pragma unroll 4
        for (int i = tid; i < ncache; i += kThreads) {
          const unsigned int k = cache[i];
          const unsigned int r = k - lo;
          if (r <= span) atomicAdd(&hA[r >> shift], 1u);
          if (make_list && k >= lo) {
            const unsigned int j = atomicAdd(&misc->nlist, 1u);
            if (j < kListCap) misc->list[j] = i;
          }
        }
        for (int i = ncache + tid; i < n; i += kThreads) {
          const unsigned int k =
              to_key(__float_as_uint(load_f(chunk + static_cast<long long>(i) * stride1)));
          const unsigned int r = k - lo;
          if (r <= span) atomicAdd(&hA[r >> shift], 1u);
          if (make_list && k >= lo) {
            const unsigned int j = atomicAdd(&misc->nlist, 1u);
            if (j < kListCap) misc->list[j] = i;
          }
        }
      } else {
        for (int i = tid; i < n; i += kThreads) {
          const unsigned int k = key_at(i, ncache, cache, chunk, stride1);
          const unsigned int r = (posmax - static_cast<unsigned int>(start + i)) - plo;
          if (k == lo && r <= pspan) atomicAdd(&hA[r >> shift], 1u);
        }
      }
    }

    // Group sums of this block's histogram (32 groups of 32 bins), published
    // for the other blocks; double-buffered by pass parity like the bins.
    __syncthreads();
    {
      const unsigned int gs = __reduce_add_sync(0xffffffffu, hA[tid]);
      if (lane == 0) misc->gsum[par][warp] = gs;
    }
    // All histograms and group sums complete (and every block is done
    // reading the previous pass's buffers).
    cluster.sync();
    RS8_MARK(2);
    if (make_list) {  // the list is complete now (the barrier above orders it)
      make_list = false;
      use_list = misc->nlist <= static_cast<unsigned int>(kListCap);
    }

    // Warp 0 finds the cutoff bin with two small DSMEM rounds: the cluster's
    // 32 group sums, then the 32 bins of the group holding the cutoff.
    if (warp == 0) {
      unsigned int gq[CL];
#pragma unroll
      for (int q = 0; q < CL; ++q) gq[q] = cluster.map_shared_rank(&misc->gsum[par][0], q)[lane];
      unsigned int tg = 0;
#pragma unroll
      for (int q = 0; q < CL; ++q) tg += gq[q];
      const unsigned int ginc = warp_suffix_incl(tg, lane);
      const unsigned int gabove = ginc - tg;  // keys in groups above this lane's
      const unsigned int ghit = __ballot_sync(0xffffffffu, gabove < krem && krem <= ginc);
      if (ghit == 0) {
        if (lane == 0) misc->cnt = 0;  // fewer than krem keys counted: redo
      } else {
        const int g = __ffs(ghit) - 1;
        const unsigned int base_above = __shfl_sync(0xffffffffu, gabove, g);
        unsigned int bq[CL];
#pragma unroll
        for (int q = 0; q < CL; ++q) bq[q] = cluster.map_shared_rank(hA, q)[32 * g + lane];
        unsigned int c = 0;
#pragma unroll
        for (int q = 0; q < CL; ++q) c += bq[q];
        const unsigned int binc = warp_suffix_incl(c, lane);
        const unsigned int above = base_above + (binc - c);
        if (above < krem && krem <= above + c) {
          misc->digit = 32 * g + lane;
          misc->above = above;
          misc->cnt = c;
        }
      }
    }
    __syncthreads();
    par ^= 1;
    const unsigned int cnt = misc->cnt;
    // Swap buffers: the next pass writes the one nobody reads now.
    unsigned int* t = hA;
    hA = hB;
    hB = t;
    if (cnt == 0) {  // fewer than K keys above +0.0's bucket: count them all
      redo0 = true;
      continue;
    }
    redo0 = false;
    const unsigned int d = misc->digit;
    krem -= misc->above;

    // Narrow the open range to the chosen digit.
    if (phase == 0) {
      lo = bucket_lo(d);
      hi = bucket_hi(d);
      make_list = kList;
      // Few entries at or above the cutoff bucket: take them all as
      // candidates and let the ranking pick the top K exactly (no more passes).
      ncand = (K - krem) + cnt;
      if (ncand <= static_cast<unsigned int>(kCap)) break;
      ncand = K;
    } else if (phase == 1) {
      lo = lo + (d << shift);
      const unsigned int w = (1u << shift) - 1u;
      hi = (hi - lo < w) ? hi : lo + w;
    } else {
      plo = plo + (d << shift);
      const unsigned int w = (1u << shift) - 1u;
      phi = (phi - plo < w) ? phi : plo + w;
    }
    if (cnt == krem) break;  // every open entry is selected
    if (phase <= 1 && lo != hi) {
      phase = 1;
      const int bits = 32 - __clz(hi - lo);
      shift = bits > kDigitBits ? bits - kDigitBits : 0;
    } else {
      // One key ties at the cutoff: keep its lowest positions.
      if (phase == 2 && plo == phi) break;  // unreachable (cnt would be 1)
      if (phase != 2) {
        phase = 2;
        plo = 0;
        phi = posmax;
      }
      const unsigned int ps = phi - plo;
      const int bits = 32 - __clz(ps);
      shift = bits > kDigitBits ? bits - kDigitBits : 0;
    }
  }
  if (phase != 2) plo = 0;  // key-decided cutoff: every position of [lo, hi] in
#if defined(RS8_STAGE) && RS8_STAGE == 2
  cluster.sync();
  return;  // timing variant: through the radix passes
#endif

  RS8_MARK(3);  // radix loop left
  // ---- local gather + sort: this block's selected entries, descending -----
  // U lives in hA, which after the final swap is the buffer no other block
  // reads; the sorted list S goes to the end of the (now free) key cache.
  constexpr int kLocalCap = kBins / 2;  // 512 composites
  unsigned long long* U = reinterpret_cast<unsigned long long*>(hA);
  unsigned long long* S = reinterpret_cast<unsigned long long*>(cache) +
                          (P::kCache / 2 - kLocalCap);
  unsigned long long* pulled = reinterpret_cast<unsigned long long*>(cache);
  static_assert(P::kCache / 2 - kLocalCap >= P::kAuxBytes / 8, "pull area overlaps S");
  const int m = use_list ? static_cast<int>(misc->nlist) : n;
  auto take = [&](int i, unsigned int k) {
    const unsigned int inv = posmax - static_cast<unsigned int>(start + i);
    if ((k > hi) || (k >= lo && inv >= plo)) {
      const unsigned int e = atomicAdd(&misc->nloc, 1u);
      if (e < static_cast<unsigned int>(kLocalCap))
        U[e] = (static_cast<unsigned long long>(k) << 32) |
               static_cast<unsigned long long>(0xffffffffu - static_cast<unsigned int>(start + i));
    }
  };
  if (use_list) {
    for (int j = tid; j < m; j += kThreads) {
      const int i = static_cast<int>(misc->list[j]);
      take(i, key_at(i, ncache, cache, chunk, stride1));
    }
  } else {
    const int nc4 = ncache >> 2;  // 16-byte reads of the cache
    for (int j = tid; j < nc4; j += kThreads) {
      const uint4 kk = reinterpret_cast<const uint4*>(cache)[j];
      if (kk.x >= lo) take(4 * j, kk.x);
      if (kk.y >= lo) take(4 * j + 1, kk.y);
      if (kk.z >= lo) take(4 * j + 2, kk.z);
      if (kk.w >= lo) take(4 * j + 3, kk.w);
    }
    for (int i = nc4 * 4 + tid; i < ncache; i += kThreads) take(i, cache[i]);
    // Tail (past the cache): 8 independent global loads in flight per thread.
    constexpr int kT = 8;
    for (int i0 = ncache + tid; i0 < n; i0 += kT * kThreads) {
      unsigned int kk[kT];
#pragma unroll
      for (int u = 0; u < kT; ++u) {
        const int i = i0 + u * kThreads;
        kk[u] = (i < n) ? __float_as_uint(load_f(chunk + static_cast<long long>(i) * stride1)) : 0u;
      }
#pragma unroll
      for (int u = 0; u < kT; ++u) {
        const int i = i0 + u * kThreads;
        if (i < n) {
          const unsigned int k = to_key(kk[u]);
          if (k >= lo) take(i, k);
        }
      }
    }
  }
  __syncthreads();  // U complete, and nobody reads the cache any more
  RS8_MARK(4);
  const unsigned int nloc = misc->nloc;
  if (nloc <= static_cast<unsigned int>(kLocalCap)) {
    // Rank sort, G threads per entry (as many as the block has): S[#greater] = U[e].
    const unsigned int G = nloc <= 32 ? 32u : nloc <= 64 ? 16u : nloc <= 128 ? 8u
                                          : nloc <= 256 ? 4u : 2u;
    const unsigned int e = tid / G;
    const unsigned int g = tid % G;
    const unsigned long long me = (e < nloc) ? U[e] : 0ull;
    unsigned int gt0 = 0, gt1 = 0;
    unsigned int j = g;
    for (; j + G < nloc; j += 2 * G) {
      gt0 += (U[j] > me) ? 1u : 0u;
      gt1 += (U[j + G] > me) ? 1u : 0u;
    }
    if (j < nloc) gt0 += (U[j] > me) ? 1u : 0u;
    unsigned int gt = gt0 + gt1;
    for (unsigned int off = 1; off < G; off <<= 1) gt += __shfl_xor_sync(0xffffffffu, gt, off);
    if (g == 0 && e < nloc) S[gt] = me;
  }
  RS8_MARK(5);  // sorted
  // Every block's sorted list and count are ready; every histogram read is done.
  cluster.sync();
  RS8_MARK(6);
  if (tid < CL) misc->nq[tid] = *cluster.map_shared_rank(&misc->nloc, tid);
  __syncthreads();
  bool fits = true;
  unsigned int total = 0;
#pragma unroll
  for (int q = 0; q < CL; ++q) {
    fits = fits && misc->nq[q] <= static_cast<unsigned int>(kLocalCap);
    total += misc->nq[q];
  }
  fits = fits && total <= static_cast<unsigned int>(P::kAuxBytes / 8);

#if defined(RS8_STAGE) && RS8_STAGE == 3
  cluster.sync();
  return;  // timing variant: through the local gather and sort
#endif
  if (fits) {
    // Pull every block's sorted list into this block (one round of DSMEM
    // loads), then rank locally: rank(e) = sum over q of #(list_q > S[e]).
    unsigned int pre[CL + 1];  // prefix sums of nq (compile-time indices only)
    pre[0] = 0;
#pragma unroll
    for (int q = 0; q < CL; ++q) pre[q + 1] = pre[q] + misc->nq[q];
    for (unsigned int t = tid; t < total; t += kThreads) {
      int q = 0;
      unsigned int base_q = 0;
#pragma unroll
      for (int r = 1; r < CL; ++r) {
        if (t >= pre[r]) {
          q = r;
          base_q = pre[r];
        }
      }
      pulled[t] = cluster.map_shared_rank(S, q)[t - base_q];
    }
    // Done reading other blocks: arrive now, wait only before exiting.
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
    __syncthreads();
    RS8_MARK(7);  // pulled
    const int q = tid % CL;
    unsigned int pq_lo = 0, pq_hi = 0;
#pragma unroll
    for (int r = 0; r < CL; ++r) {
      if (r == q) {
        pq_lo = pre[r];
        pq_hi = pre[r + 1];
      }
    }
    const unsigned long long* Pq = pulled + pq_lo;
    const unsigned int nqq = pq_hi - pq_lo;
    for (unsigned int base = 0; base < nloc * CL; base += kThreads) {
      const unsigned int e = (base + tid) / CL;
      unsigned int cnt_gt = 0;
      unsigned long long me = 0;
      if (e < nloc) {
        me = S[e];
        if (q == rank) {
          cnt_gt = e;
        } else {
          unsigned int a = 0, b = nqq;
          while (a < b) {
            const unsigned int mid = (a + b) >> 1;
            if (Pq[mid] > me) a = mid + 1; else b = mid;
          }
          cnt_gt = a;
        }
      }
#pragma unroll
      for (int off = 1; off < CL; off <<= 1) cnt_gt += __shfl_xor_sync(0xffffffffu, cnt_gt, off);
      if (q == 0 && e < nloc && cnt_gt < static_cast<unsigned int>(K))
        out[cnt_gt] = static_cast<int>(0xffffffffu - static_cast<unsigned int>(me));
    }
    RS8_MARK(8);  // ranked
    // Keep S alive until every block has pulled it.
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
    RS8_MARK(9);
    return;
  }
  // A block selected more than kLocalCap entries (skewed rows): broadcast
  // every candidate to every block instead and rank there.

  // ---- gather: exactly K selected entries, broadcast to all 8 blocks --------
  unsigned int* counter0 = cluster.map_shared_rank(&misc->counter, 0);
  const unsigned int lt_mask = (1u << lane) - 1u;
  for (int base = 0; base < m; base += kThreads) {
    const int j = base + tid;
    bool sel = false;
    unsigned int k = 0;
    int i = 0;
    if (j < m) {
      i = use_list ? static_cast<int>(misc->list[j]) : j;
      // From global memory (L2): the sorted list may have overwritten the
      // end of the key cache.
      k = to_key(__float_as_uint(load_f(chunk + static_cast<long long>(i) * stride1)));
      const unsigned int inv = posmax - static_cast<unsigned int>(start + i);
      sel = (k > hi) || (k >= lo && inv >= plo);
    }
    const unsigned int msk = __ballot_sync(0xffffffffu, sel);
    if (msk) {
      const int leader = __ffs(msk) - 1;
      unsigned int slot0 = 0;
      if (lane == leader) slot0 = atomicAdd(counter0, static_cast<unsigned int>(__popc(msk)));
      slot0 = __shfl_sync(0xffffffffu, slot0, leader);
      if (sel) {
        const unsigned int slot = slot0 + __popc(msk & lt_mask);
        if (slot < ncand) {
          const unsigned long long c =
              (static_cast<unsigned long long>(k) << 32) |
              static_cast<unsigned long long>(0xffffffffu - static_cast<unsigned int>(start + i));
#pragma unroll
          for (int q = 0; q < CL; ++q) cluster.map_shared_rank(cand, q)[slot] = c;
        }
      }
    }
  }

  // All candidates have landed in every block.
  cluster.sync();

  // ---- rank: candidate s goes to slot (number of candidates above it) ------
  // Block r ranks candidates [r*kCap/8, (r+1)*kCap/8); kGroup threads share one.
  constexpr int kPerBlock = kCap / CL;
  constexpr int kGroup = kThreads / kPerBlock;
  static_assert(kGroup >= 1 && kGroup <= 32 && kThreads % kPerBlock == 0, "rank split");
  const unsigned int s = rank * kPerBlock + tid / kGroup;
  const int g = tid % kGroup;
  const unsigned long long mine_c = (s < ncand) ? cand[s] : 0ull;
  unsigned int greater = 0;
#pragma unroll 8
  for (unsigned int j = g; j < ncand; j += kGroup) greater += (cand[j] > mine_c) ? 1u : 0u;
#pragma unroll
  for (int off = kGroup / 2; off > 0; off >>= 1)
    greater += __shfl_xor_sync(0xffffffffu, greater, off);
  if (g == 0 && s < ncand && greater < static_cast<unsigned int>(K))
    out[greater] = static_cast<int>(0xffffffffu - static_cast<unsigned int>(mine_c));
}

template <int K, int CL>
cudaError_t launch_cl(const float* logits, long long stride0, long long stride1, long long ncols,
                      const int* seq_lens, int seq_2d, int next_n, int* indices, int num_rows,
                      cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned int>(num_rows) * CL);
  topk_decode_kernel<K, CL><<<grid, kThreads, Plan<K>::kSmemBytes, stream>>>(
      logits, stride0, stride1, ncols, seq_lens, seq_2d, next_n, indices);
  return cudaGetLastError();
}

// Clusters of CL blocks that fit on the device at once (0 on error).
template <int K, int CL>
int resident_clusters() {
  cudaError_t e = cudaFuncSetAttribute(topk_decode_kernel<K, CL>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       Plan<K>::kSmemBytes);
  if (e != cudaSuccess) return 0;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(CL * 64);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = Plan<K>::kSmemBytes;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = CL;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, topk_decode_kernel<K, CL>, &cfg) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

// Rows get 8 blocks each while all rows fit on the device in one wave; with
// more rows, 4 or 2 blocks per row keep them in one wave (rows longer than
// the smaller cluster's cache take the tail path).  The choice depends only
// on the row count and the device, so a captured graph stays valid.
template <int K>
cudaError_t launch(const float* logits, long long stride0, long long stride1, long long ncols,
                   const int* seq_lens, int seq_2d, int next_n, int* indices, int num_rows,
                   cudaStream_t stream) {
  static int fit8[64] = {}, fit4[64] = {};
  static bool ready[64] = {};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 0 || dev >= 64) return cudaErrorInvalidDevice;
  if (!ready[dev]) {
    fit8[dev] = resident_clusters<K, 8>();
    fit4[dev] = resident_clusters<K, 4>();
    if (resident_clusters<K, 2>() == 0 || fit8[dev] == 0) return cudaErrorInvalidConfiguration;
    ready[dev] = true;
  }
#ifdef RS8_FORCE_CLUSTER
  constexpr int kForce = RS8_FORCE_CLUSTER;
#else
  constexpr int kForce = 0;
#endif
  if (kForce == 8 || (kForce == 0 && num_rows <= fit8[dev]))
    return launch_cl<K, 8>(logits, stride0, stride1, ncols, seq_lens, seq_2d, next_n, indices,
                           num_rows, stream);
  if (kForce == 4 || (kForce == 0 && num_rows <= fit4[dev]))
    return launch_cl<K, 4>(logits, stride0, stride1, ncols, seq_lens, seq_2d, next_n, indices,
                           num_rows, stream);
  return launch_cl<K, 2>(logits, stride0, stride1, ncols, seq_lens, seq_2d, next_n, indices,
                         num_rows, stream);
}

}  // namespace
}  // namespace rs8

extern "C" {

// C entry point (ctypes / any host code).  Returns a cudaError_t value
// (0 = success).  indices: int32 [num_rows, k], row-contiguous.
int rs8_topk_decode(const float* logits, long long stride0, long long stride1, long long ncols,
                    const int* seq_lens, int seq_2d, int next_n, int* indices, int num_rows,
                    int k, void* stream) {
  if (num_rows <= 0) return 0;
  if (next_n <= 0 || stride0 < 0 || stride1 <= 0) return static_cast<int>(cudaErrorInvalidValue);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (k) {
    case 512:
      return rs8::launch<512>(logits, stride0, stride1, ncols, seq_lens, seq_2d, next_n, indices,
                              num_rows, s);
    case 1024:
      return rs8::launch<1024>(logits, stride0, stride1, ncols, seq_lens, seq_2d, next_n,
                               indices, num_rows, s);
    case 2048:
      return rs8::launch<2048>(logits, stride0, stride1, ncols, seq_lens, seq_2d, next_n,
                               indices, num_rows, s);
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

// Cached keys per block for k (0 if k unsupported); tests probe the edges.
int rs8_cache_keys(int k) {
  switch (k) {
    case 512:
      return rs8::Plan<512>::kCache;
    case 1024:
      return rs8::Plan<1024>::kCache;
    case 2048:
      return rs8::Plan<2048>::kCache;
    default:
      return 0;
  }
}

// Largest cluster (blocks per row) the kernel uses; fewer when rows are many.
int rs8_cluster_size(void) { return rs8::kCluster; }

#ifdef RS8_TIMING
// Copy row 0's stage clocks (kCluster x 16 int64) to host memory.
int rs8_read_clocks(long long* host) {
  return static_cast<int>(
      cudaMemcpyFromSymbol(host, rs8::g_rs8_clock, sizeof(rs8::g_rs8_clock)));
}
#endif

}  // extern "C"
