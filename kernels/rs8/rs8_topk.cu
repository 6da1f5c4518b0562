// rs8: exact per-row top-k for the sparse-attention indexer (decode rows).
//
// Contract: vLLM's `_C::top_k_per_row_decode` (see README.md), with one
// canonical output order: key descending under the float32 total bit order
// (+0.0 above -0.0, positive NaN above +inf, negative NaN below -inf), then
// lower position first.  The output is therefore a pure function of the input.
//
// Design (README.md has the long form): one thread-block cluster of CL blocks
// per row (16 where the device allows it and every row fits at once, else 8,
// else 4 in waves); each block owns a contiguous slice of the row.  Each
// shape has two kernels: kAny handles any row; the other, launched when the
// host sees contiguous 16-byte-aligned rows whose slices the registers hold,
// leaves out the strided-row and tail code (which cost time even unexecuted).
//
//   1. Every thread loads its keys into registers (the rest of a longer slice,
//      the "tail", is re-read from L2) and adds the coarse bucket of its own
//      largest key to a 1024-bin histogram.
//   2. One push round through distributed shared memory (st.async counted on
//      the receiver's mbarrier: every block's 32-bin window of suffix counts
//      around its own estimate) bounds the cluster's histogram from below and
//      finds the bucket holding the k-th largest per-thread maximum.  Its
//      lower edge T is a safe threshold: at least k keys are >= T, so every
//      key of the top k is >= T, and for ordinary rows only a few more than k
//      are.
//   3. Each block collects its keys >= T, sorts them as (key, ~position)
//      composites and pushes the sorted keys (4 bytes each) and its count into
//      every other block.  Positions need not travel: blocks own ascending
//      slices, so a tie on the key with block q is above me exactly when q is
//      a lower block.
//   4. Each block ranks its own entries against the CL sorted lists (branch-
//      free binary searches in its own shared memory) and writes each index at
//      its rank.
//
// No cluster barrier on this path, only waits on a block's own mbarriers.
// When a block has more candidates than its list holds (lists fill the shared
// memory; heavy ties, constant or sorted rows overflow them), every block takes
// the general path instead: radix passes over the key, then over inverted
// positions, narrow the cut to exactly k, re-reading the row from L2.  No host
// sync, no allocation, no global scratch: a single launch that CUDA graphs can
// capture.
//
// One source for sm_90a (H100/H200) and sm_120 (RTX 50xx): shared memory per
// block stays under SM120's 99 KB opt-in limit; 16-block clusters are
// non-portable and used only where the occupancy query grants them.

#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>

namespace cg = cooperative_groups;

namespace rs8 {
// Internal linkage throughout: two builds (say, the -DRS8_BREAK test build) can
// live in one process without sharing template statics (GNU unique symbols).
namespace {

constexpr int kCluster = 8;       // blocks per row (portable cluster size)
constexpr int kMaxCluster = 16;   // blocks per row where the device allows (non-portable)
#ifndef RS8_THREADS
#define RS8_THREADS 0  // probe: threads per block for every cluster size (0: the measured default)
#endif
// Threads per block for CL blocks per row.  8- and 4-block clusters run 1,024
// (NOTES.md runs 69-78: 8 warps per scheduler overlap the load, collect and
// sort chains of threads that hold many keys; 2 requests 1-6% faster than 512,
// 4 and 8 requests 7-21%); 16-block clusters 512 (with ~14 keys per thread,
// 1,024 was 6-9% slower at one request: the block barriers and the sort's 16
// threads per entry cost more than the overlap gives).
template <int CL>
struct Block {
  static constexpr int kThreads = RS8_THREADS ? RS8_THREADS : (CL == 16 ? 512 : 1024);
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kLgThreads =
      kThreads == 1024 ? 10 : kThreads == 512 ? 9 : kThreads == 256 ? 8 : 7;
  static_assert((1 << kLgThreads) == kThreads, "threads per block: 128, 256, 512 or 1024");
  static_assert(kThreads < 65536, "packed window counts need 16 bits");  // (one max per thread)
};
#ifndef RS8_STOP
#define RS8_STOP 0  // timing probe only (NOTES.md run 31): leave early, output invalid
#endif
#ifndef RS8_PROBE
// timing probe only (NOTES.md, nineteenth session): 10 + n leaves where
// RS8_STOP == n does, by a runtime test that keeps the whole code image;
// 3 drops the fast path's output writes
#define RS8_PROBE 0
#endif
#define RS8_LEAVE(n) (RS8_STOP == (n) || (RS8_PROBE == 10 + (n) && ncols > 0))
#ifndef RS8_TAIL0
#define RS8_TAIL0 4  // tail float4 loads in flight per thread while keys fill registers
#endif
constexpr int kRowRegKeys = 196608;  // keys per row held in registers (4 blocks: 131,072)
// Keys per block held in registers, and float4s of them per thread, for CL blocks per row.
// The kAny = false kernel (below) may hold more: RS8_FAST_ROW_KEYS=262144 gives
// 262,144-wide calls that kernel too, but cost 0.16 µs at tight widths (NOTES.md run 127).
#ifndef RS8_FAST_ROW_KEYS
#define RS8_FAST_ROW_KEYS 196608
#endif
template <int CL, bool kAny = true>
struct Regs {
  // At most 12 float4s (48 keys) per thread in 128 registers with 512 threads,
  // 8 (32 keys) in 64 with 1,024 (12 spilled there, NOTES.md run 77).  Checked on
  // sm_90a; sm_120's 4-block kernels spill 20 bytes at 8 (not measured).  16 and 8
  // blocks hold 6; 4 blocks hold 8, i.e. 131,072 keys of a row, and stream the
  // rest (the tail).
  static constexpr int kThreads = Block<CL>::kThreads;
  static constexpr int kMaxQuads = kThreads >= 1024 ? 8 : 12;
  static constexpr int kRow = kAny ? kRowRegKeys : RS8_FAST_ROW_KEYS;
  static constexpr int kQuads =
      kRow / CL / (4 * kThreads) < kMaxQuads ? kRow / CL / (4 * kThreads) : kMaxQuads;
  static constexpr int kKeys = kQuads * 4 * kThreads;
  static_assert(kQuads >= 1, "block shape");
};
constexpr int kDigitBits = 10;    // radix digit width (general path)
constexpr int kBins = 1 << kDigitBits;
constexpr int kSmemLimit = 101376;  // SM120: 99 KB opt-in per block
constexpr int kMiscBytes = 4608;  // shared-memory bytes of Misc (below), rounded up
// The threshold's one DSMEM round: every block sends a window of kWin bins of
// its maxima histogram placed around its own estimate of the cut (the bin of
// its (K/CL)-th largest maximum, 8-23 bins above the window's bottom), as
// kWin + 1 suffix counts (maxima in bins >= each bin of the window, and >= the
// bin past it) and the window's position, two 16-bit halves to a word.  A
// block's counts are at most kThreads (one maximum per thread).
constexpr int kWin = 32;
constexpr int kWinBelow = 8;  // window bottom: this many bins below the estimate's half-group
constexpr int kWinWords = (kWin + 2) / 2;  // halves: kWin + 1 suffix counts, then the position
constexpr int kHalfGroups = kBins / 16;      // 16-bin half-groups: the estimate's unit

// Shared-memory plan per k.  The fast path uses [hist | U | S | seg]; the general
// path, which only starts after the fast path's last DSMEM access, reuses the
// same bytes as [hA | hB | cand].  Misc sits after both.
template <int K, int CL>
struct Plan {
  // Candidates one block may contribute: as many as shared memory allows for
  // its own lists and CL received ones (1,156 with 16 blocks, 1,928 with 8,
  // 2,894 with 4), whatever K.  Lists are used only as far as they are filled,
  // so this costs nothing on ordinary rows (run 29 in NOTES.md measured it 3%
  // faster than 4K/CL), and a row whose winners crowd into one slice (recency
  // bias, a hot prefix) stays on the fast path (research/rs8_candidates.py).
  // Per candidate: its composite in U (collected) and S (sorted), and its key
  // in each of the CL received lists.
  static constexpr int kSegCap = (kSmemLimit - kMiscBytes - kBins * 4) / (16 + 4 * CL) - 2;
  // Received lists (keys only) sit an odd number of words apart: with a
  // power-of-2 stride every list would start in the same shared-memory bank,
  // and the rank step's binary searches (one list per lane, similar indices)
  // would conflict CL ways.
  static constexpr int kSegStride = (kSegCap + 1) | 1;
  static constexpr int kFastBytes = kBins * 4 + kSegCap * 16 + CL * kSegStride * 4;
  static constexpr int kSlowCap = K > kBins ? K : kBins;  // candidate slots, general path
  static constexpr int kSlowBytes = 2 * kBins * 4 + kSlowCap * 8;
  static constexpr int kAreaBytes = kFastBytes > kSlowBytes ? kFastBytes : kSlowBytes;
  static constexpr int kSmemBytes = kAreaBytes + kMiscBytes;
  static_assert(kSmemBytes <= kSmemLimit, "shared memory plan exceeds SM120's limit");
  static_assert(K % CL == 0, "bad k");
};

struct Misc {
  unsigned long long mb_win;   // fast path mbarriers: every block's window landed,
  unsigned long long mb_cnt;   // every block's list length landed,
  unsigned long long mb_list;  // every list landed
  unsigned int win_all[kMaxCluster][kWinWords];  // fast path: every block's window (halves)
  unsigned int sh[kHalfGroups];  // fast path: this block's maxima in bins >= 16 h, per half-group h
  unsigned int nloc;     // this block's candidates (may exceed kSegCap)
  unsigned int thr;      // fast path: the threshold key T
  unsigned int counter;  // general path, block 0's: next free candidate slot
  unsigned int digit;    // general path: result of the current pass
  unsigned int above;
  unsigned int cnt;
  unsigned int segn[kMaxCluster];  // every block's list length (written by that block)
  unsigned int gsum[2][32];     // group sums of the bins (double-buffered by pass)
};
static_assert(sizeof(Misc) <= kMiscBytes, "Misc must fit the plan's misc bytes");

#ifdef RS8_TIMING
// Stage clocks of row 0's blocks (timing build only): [block][stage]; [0][14]
// holds row 0's candidate count, [0][15] counts rows taking the general path.
__device__ long long g_rs8_clock[kMaxCluster][16];
#define RS8_MARK(st)                                                   \
  do {                                                                  \
    if (row == 0 && tid == 0) g_rs8_clock[rank][st] = clock64();        \
  } while (0)
#else
#define RS8_MARK(st) \
  do {               \
  } while (0)
#endif

#ifdef RS8_TSTAMP
// Wall-clock stamps (globaltimer, ns) of every block, for the last call only
// (probe build; research/rs8_block_times.py reads them).  Stage stamps of thread 0
// per block, [block][0..6], smid in [block][7]; per warp around the collect,
// [block][warp][0..3].  clock64 (RS8_MARK) is per SM, so only these can line
// up blocks and clusters against each other.  A stamp taken "after" a value
// branches on it first: a globaltimer read depends on nothing, and ptxas
// would otherwise issue it before the barrier or load it follows has resolved.
constexpr int kStampBlocks = 1024;
__device__ unsigned long long g_rs8_stamp[kStampBlocks][8];
__device__ unsigned long long g_rs8_wstamp[kStampBlocks][32][4];
__device__ __forceinline__ unsigned long long rs8_gtime() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}
__device__ __forceinline__ unsigned long long rs8_gtime_after(unsigned int v) {
  if (v == 0x9e3779b9u) asm volatile("trap;");  // never: a branch on v
  return rs8_gtime();
}
#define RS8_STAMP(i)                       \
  do {                                     \
    if (tid == 0) rs8_ts[i] = rs8_gtime(); \
  } while (0)
#define RS8_WSTAMP(i, t)             \
  do {                               \
    if (lane == 0) rs8_wts[i] = (t); \
  } while (0)
#else
#define RS8_STAMP(i) \
  do {               \
  } while (0)
#define RS8_WSTAMP(i, t) \
  do {                   \
  } while (0)
#endif

// Float32 bits -> unsigned key whose unsigned order is the float total order.
__device__ __forceinline__ unsigned int to_key(unsigned int u) {
#ifdef RS8_BREAK
  // Deliberately wrong build for the test suite: -0.0 collapses onto +0.0.
  if (u == 0x80000000u) u = 0u;
#endif
  // Negative: flip every bit; non-negative: set the sign bit (branch-free).
  return u ^ (static_cast<unsigned int>(static_cast<int>(u) >> 31) | 0x80000000u);
}

// A row's register-held quads are read once: no L1 allocation, and 256-byte L2
// fetches (1-3% faster than __ldg at 1 and 8 requests, NOTES.md run 39).
__device__ __forceinline__ float4 load_quad(const float4* p) {
  float4 f;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.f32 {%0,%1,%2,%3}, [%4];"
               : "=f"(f.x), "=f"(f.y), "=f"(f.z), "=f"(f.w)
               : "l"(p));
  return f;
}
__device__ __forceinline__ unsigned int load_bits(const float* p) {
  return __float_as_uint(__ldg(p));
}

// Coarse bucket: a monotone map of the key onto 1024 bins with 16 bins per
// octave for |x| in [2^-14, 2^18) (like fp16's top bits), saturating outside.
// Exactness never depends on it: the fast path only needs monotonicity, and
// the general path refines inside a bucket.
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

// Composite sort key: key high, inverted position low, so a larger composite
// is a larger key or, on a tie, a lower position.  Composites are distinct.
__device__ __forceinline__ unsigned long long composite(unsigned int key, unsigned int pos) {
  return (static_cast<unsigned long long>(key) << 32) | static_cast<unsigned long long>(~pos);
}
__device__ __forceinline__ int position_of(unsigned long long c) {
  return static_cast<int>(~static_cast<unsigned int>(c));
}

// ---- distributed shared memory by pushing: st.async + mbarrier tx counts ----
// Each exchange is one-way: a block writes into the others' shared memory with
// st.async, which counts the bytes down on the receiver's mbarrier, and the
// receiver waits on its own mbarrier.  No cluster-wide barrier (and so no
// GPU-scope memory fence) sits on the fast path.
__device__ __forceinline__ unsigned int smem_addr(const void* p) {
  return static_cast<unsigned int>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ unsigned int peer_addr(unsigned int a, int q) {
  unsigned int r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(q));
  return r;
}
__device__ __forceinline__ void mbar_init(unsigned int bar, unsigned int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Arrive once, expecting `bytes` more to land (tx-count may run ahead of this).
__device__ __forceinline__ void mbar_expect(unsigned int bar, unsigned int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.relaxed.cta.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned int bar) {  // phase 0 (each is used once)
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "RS8_WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n"
      "@!p bra RS8_WAIT_%=;\n"
      "}\n" ::"r"(bar)
      : "memory");
}
__device__ __forceinline__ void push_u32(unsigned int raddr, unsigned int v, unsigned int rbar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.u32 [%0], %1, [%2];" ::"r"(
                   raddr),
               "r"(v), "r"(rbar)
               : "memory");
}

// Inclusive suffix sum inside a warp: lane i gets sum of lanes >= i.
__device__ __forceinline__ unsigned int warp_suffix_incl(unsigned int x, int lane) {
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const unsigned int y = __shfl_down_sync(0xffffffffu, x, off);
    if (lane + off < 32) x += y;
  }
  return x;
}

// The lane whose bin holds the need-th largest entry, with bins ascending by
// lane and `base` entries above lane 31's bin: sets hit_lane, above (entries
// in higher bins) and cnt (entries in that bin); false if the warp's bins
// hold fewer than need - base.  Uniform across the warp.
__device__ __forceinline__ bool warp_cut(unsigned int x, unsigned int base, unsigned int need,
                                         int lane, int& hit_lane, unsigned int& above,
                                         unsigned int& cnt) {
  const unsigned int ab = base + warp_suffix_incl(x, lane) - x;
  const unsigned int hit = __ballot_sync(0xffffffffu, ab < need && need <= ab + x);
  if (hit == 0) return false;
  hit_lane = __ffs(hit) - 1;
  above = __shfl_sync(0xffffffffu, ab, hit_lane);
  cnt = __shfl_sync(0xffffffffu, x, hit_lane);
  return true;
}

// Warp 0 of every block: the bin holding the krem-th largest count of the
// cluster's histograms `hist` (group sums in `gsum`), in two small DSMEM
// rounds (32 group sums, then the 32 bins of the chosen group).  Returns
// true and sets bin/above/cnt when found; false when the cluster counted
// fewer than krem.  Uniform across the warp.
template <int CL>
__device__ __forceinline__ bool find_bin(cg::cluster_group& cluster, unsigned int* hist,
                                         unsigned int* gsum, unsigned int krem, int lane,
                                         unsigned int& bin, unsigned int& above,
                                         unsigned int& cnt) {
  unsigned int gq[CL];
#pragma unroll
  for (int q = 0; q < CL; ++q) gq[q] = cluster.map_shared_rank(gsum, q)[lane];
  unsigned int tg = 0;
#pragma unroll
  for (int q = 0; q < CL; ++q) tg += gq[q];
  int g = 0;
  unsigned int base_above = 0, gcnt = 0;
  if (!warp_cut(tg, 0u, krem, lane, g, base_above, gcnt)) return false;
  unsigned int bq[CL];
#pragma unroll
  for (int q = 0; q < CL; ++q) bq[q] = cluster.map_shared_rank(hist, q)[32 * g + lane];
  unsigned int c = 0;
#pragma unroll
  for (int q = 0; q < CL; ++q) c += bq[q];
  int l = 0;
  warp_cut(c, base_above, krem, lane, l, above, cnt);  // found: the group's counts add up
  bin = 32u * g + l;
  return true;
}

// Group sums of a block's histogram (32 groups of 32 bins) for find_bin.
// Call after the histogram is complete (__syncthreads).
template <int kWarps>
__device__ __forceinline__ void publish_group_sums(const unsigned int* hist, unsigned int* gsum,
                                                   int tid) {
  for (int w = tid >> 5; w < 32; w += kWarps) {
    const unsigned int gs = __reduce_add_sync(0xffffffffu, hist[32 * w + (tid & 31)]);
    if ((tid & 31) == 0) gsum[w] = gs;
  }
}

// ---------------------------------------------------------------------------
// General path: exact for any row (ties, constant rows, skew), slower.
// Every block re-reads its slice from global memory (L2) on each pass.
// ---------------------------------------------------------------------------
template <int K, int CL>
__device__ __noinline__ void general_path(cg::cluster_group& cluster, unsigned char* smem,
                                          Misc* misc, const float* chunk, long long stride1,
                                          int n, int start, int Li, int* out, int rank) {
  using P = Plan<K, CL>;
  constexpr int kThreads = Block<CL>::kThreads;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  unsigned int* hA = reinterpret_cast<unsigned int*>(smem);
  unsigned int* hB = hA + kBins;
  unsigned long long* cand = reinterpret_cast<unsigned long long*>(smem + 2 * kBins * 4);
  constexpr int kCap = P::kSlowCap;
  auto key_at = [&](int i) {
    return to_key(load_bits(chunk + static_cast<long long>(i) * stride1));
  };
  if (tid == 0) misc->counter = 0;  // read remotely only after the barriers below

  // Selection state, identical in every block of the cluster.  Keys above hi
  // are selected, keys below lo rejected, [lo, hi] is still open.  Once the
  // open range is one key, the same is done on inverted positions [plo, phi].
  unsigned int lo = 0, hi = 0xffffffffu;
  unsigned int plo = 0, phi = 0;
  unsigned int krem = K;
  const int posbits = 32 - __clz(static_cast<unsigned int>(Li - 1));
  const unsigned int posmax = (posbits >= 32) ? 0xffffffffu : ((1u << posbits) - 1u);
  int phase = 0;  // 0: bucket pass next, 1: key passes, 2: position passes
  int shift = 0;
  int par = 0;    // pass parity: which group-sum buffer this pass uses
  unsigned int ncand = K;
  for (;;) {
    for (int b = tid; b < kBins; b += kThreads) hA[b] = 0;
    __syncthreads();
    const unsigned int span = hi - lo;
    const unsigned int pspan = phi - plo;
    for (int i = tid; i < n; i += kThreads) {
      const unsigned int k = key_at(i);
      if (phase == 0) {
        atomicAdd(&hA[bucket(k)], 1u);
      } else if (phase == 1) {
        const unsigned int r = k - lo;
        if (r <= span) atomicAdd(&hA[r >> shift], 1u);
      } else {
        const unsigned int r = (posmax - static_cast<unsigned int>(start + i)) - plo;
        if (k == lo && r <= pspan) atomicAdd(&hA[r >> shift], 1u);
      }
    }
    __syncthreads();
    publish_group_sums<Block<CL>::kWarps>(hA, misc->gsum[par], tid);
    // All histograms complete, and every block is done reading the previous
    // pass's buffers (double-buffered by parity).
    cluster.sync();
    if (tid < 32) {
      unsigned int d = 0, ab = 0, c = 0;
      find_bin<CL>(cluster, hA, misc->gsum[par], krem, lane, d, ab, c);  // always found
      if (lane == 0) {
        misc->digit = d;
        misc->above = ab;
        misc->cnt = c;
      }
    }
    __syncthreads();
    par ^= 1;
    unsigned int* t = hA;  // the next pass writes the buffer nobody reads now
    hA = hB;
    hB = t;
    const unsigned int d = misc->digit;
    const unsigned int cnt = misc->cnt;
    krem -= misc->above;
    if (phase == 0) {
      lo = bucket_lo(d);
      hi = bucket_hi(d);
      // Few entries at or above the cutoff bucket: take them all and let the
      // ranking pick the top K exactly (no more passes).
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
      if (phase != 2) {
        phase = 2;
        plo = 0;
        phi = posmax;
      }
      const int bits = 32 - __clz(phi - plo);
      shift = bits > kDigitBits ? bits - kDigitBits : 0;
    }
  }
  if (phase != 2) plo = 0;  // key-decided cutoff: every position of [lo, hi] in

  // Gather the selected entries into every block (slots from block 0's counter).
  unsigned int* counter0 = cluster.map_shared_rank(&misc->counter, 0);
  const unsigned int lt_mask = (1u << lane) - 1u;
  for (int base = 0; base < n; base += kThreads) {
    const int i = base + tid;
    bool sel = false;
    unsigned int k = 0;
    if (i < n) {
      k = key_at(i);
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
          const unsigned long long c = composite(k, static_cast<unsigned int>(start + i));
#pragma unroll
          for (int q = 0; q < CL; ++q) cluster.map_shared_rank(cand, q)[slot] = c;
        }
      }
    }
  }
  cluster.sync();  // all candidates have landed in every block

  // Rank: candidate s goes to slot (number of candidates above it).  Block r
  // ranks candidates [r*kCap/8, (r+1)*kCap/8); kGroup threads share one.
  constexpr int kPerBlock = kCap / CL;
  constexpr int kGroup = kThreads >= kPerBlock ? kThreads / kPerBlock : 1;
  constexpr int kSlots = kThreads / kGroup;  // candidates ranked per round
  static_assert(kGroup <= 32 && kPerBlock % kSlots == 0, "rank split");
  for (int r0 = 0; r0 < kPerBlock; r0 += kSlots) {
    const unsigned int s = rank * kPerBlock + r0 + tid / kGroup;
    const int g = tid % kGroup;
    const unsigned long long mine = (s < ncand) ? cand[s] : 0ull;
    unsigned int greater = 0;
#pragma unroll 8
    for (unsigned int j = g; j < ncand; j += kGroup) greater += (cand[j] > mine) ? 1u : 0u;
#pragma unroll
    for (int off = kGroup / 2; off > 0; off >>= 1)
      greater += __shfl_xor_sync(0xffffffffu, greater, off);
    if (g == 0 && s < ncand && greater < static_cast<unsigned int>(K))
      out[greater] = position_of(mine);
  }
}

// Visit the tail of a slice (entries tail0..n-1, re-read from global memory):
// fn(i, key) for each.  TQ float4 loads in flight per thread when the slice
// is contiguous and 16-byte aligned (tail0 is a multiple of 4), else 2*TQ
// scalar loads.
template <int TQ, int kThreads, typename F>
__device__ __forceinline__ void scan_tail(const float* chunk, long long stride1, bool vec,
                                          int tail0, int n, int tid, F&& fn) {
  if (vec) {
    const float4* src = reinterpret_cast<const float4*>(chunk);
    const int q1 = n >> 2;  // full quads
    for (int v0 = (tail0 >> 2) + tid; v0 < q1; v0 += TQ * kThreads) {
      float4 f[TQ];
#pragma unroll
      for (int w = 0; w < TQ; ++w)
        if (v0 + w * kThreads < q1) f[w] = __ldg(src + v0 + w * kThreads);
#pragma unroll
      for (int w = 0; w < TQ; ++w) {
        const int v = v0 + w * kThreads;
        if (v < q1) {
          fn(4 * v, to_key(__float_as_uint(f[w].x)));
          fn(4 * v + 1, to_key(__float_as_uint(f[w].y)));
          fn(4 * v + 2, to_key(__float_as_uint(f[w].z)));
          fn(4 * v + 3, to_key(__float_as_uint(f[w].w)));
        }
      }
    }
    const int i = 4 * q1 + tid;  // the last 0-3 entries
    if (i >= tail0 && i < n) fn(i, to_key(load_bits(chunk + i)));
  } else {
    constexpr int kS = 2 * TQ;
    for (int i0 = tail0 + tid; i0 < n; i0 += kS * kThreads) {
      unsigned int tk[kS];
#pragma unroll
      for (int w = 0; w < kS; ++w) {
        const int i = i0 + w * kThreads;
        tk[w] = (i < n) ? load_bits(chunk + static_cast<long long>(i) * stride1) : 0u;
      }
#pragma unroll
      for (int w = 0; w < kS; ++w)
        if (i0 + w * kThreads < n) fn(i0 + w * kThreads, to_key(tk[w]));
    }
  }
}

// Columns of a row of len entries that each of its CL blocks owns: len / CL
// rounded up to a multiple of 4 (so every slice starts on 16 bytes).  The
// kernel cuts rows with it, and the host uses it to pick the kernel.
template <int CL, typename T>
__host__ __device__ constexpr T slice_cols(T len) {
  return ((len + CL - 1) / CL + 3) & ~T(3);
}

// The row's last 0-3 entries past the register quads (a slice whose length is
// not a multiple of 4), on a contiguous, aligned row: fn(i, key).
template <typename F>
__device__ __forceinline__ void scan_last(const float* chunk, int tail0, int n, int tid, F&& fn) {
  const int i = tail0 + tid;
  if (i < n) fn(i, to_key(load_bits(chunk + i)));
}

// Launched with a cluster dimension of CL (cudaLaunchKernelEx; 16 is non-portable).
// kAny: any row (strided or misaligned rows, slices longer than the registers
// hold).  The host launches the kAny = false kernel when every row is
// contiguous and 16-byte aligned and no slice can outgrow the registers (from
// the strides, the base address and ncols): it holds none of that code, whose
// presence made such calls 0.14-0.28 µs slower at one request and 0.40-0.60 at
// two, though it never ran (NOTES.md runs 119-126).
template <int K, int CL, bool kAny>
__global__ void __launch_bounds__(Block<CL>::kThreads, 1)
    topk_decode_kernel(const float* __restrict__ logits, long long stride0, int stride1, int ncols,
                       const int* __restrict__ seq_lens, int seq_2d, int next_n,
                       int* __restrict__ indices) {
  // The parameters fill 48 bytes (c[0x0][0x210..0x240) on sm_90), one 64-byte
  // constant-cache line: with 64-bit stride1 and ncols the last one (indices)
  // sat in a second line, and every block waited for two constant misses in a
  // row at its start (Nsight Compute, NOTES.md runs 56-57).
  using P = Plan<K, CL>;
  constexpr int kThreads = Block<CL>::kThreads;
  constexpr int kWarps = Block<CL>::kWarps;
  constexpr int kLgThreads = Block<CL>::kLgThreads;
  static_assert(kBins % kThreads == 0, "block shape");
  constexpr int kSegCap = P::kSegCap;
  constexpr int kSegStride = P::kSegStride;
  constexpr int kQuads = Regs<CL, kAny>::kQuads;
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned int* hist = reinterpret_cast<unsigned int*>(smem);
  unsigned long long* U = reinterpret_cast<unsigned long long*>(smem + kBins * 4);
  unsigned long long* S = U + kSegCap;  // this block's candidates, sorted
  // [CL][kSegStride]: every other block's sorted list, keys only (a tie on the
  // key is decided by the block: lower blocks hold lower positions).
  unsigned int* seg = reinterpret_cast<unsigned int*>(S + kSegCap);
  Misc* misc = reinterpret_cast<Misc*>(smem + P::kAreaBytes);

  if (RS8_LEAVE(7)) {  // probe: launch only
    if (threadIdx.x == 0) indices[blockIdx.x] = 0;
    return;
  }
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int row = blockIdx.x / CL;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
#ifdef RS8_TSTAMP
  unsigned long long rs8_ts[7] = {0, 0, 0, 0, 0, 0, 0};
  unsigned long long rs8_wts[4] = {0, 0, 0, 0};
#endif
  RS8_STAMP(0);

  // Row length (rowStart is always 0 for decode rows).
  // (one load, used only after the setup below, which overlaps its latency)
  const int seq = __ldg(seq_2d ? seq_lens + row : seq_lens + row / next_n);
  // While seq_lens is read: mbarriers (thread 0), then a relaxed cluster
  // arrive (nobody pushes into a block before it has started and initialised
  // them; the matching wait comes after the loads, by when every block has
  // long arrived), and the zeroed histogram.  Short rows leave after this
  // with nothing pending.
  const unsigned int mb_win = smem_addr(&misc->mb_win);
  const unsigned int mb_cnt = smem_addr(&misc->mb_cnt);
  const unsigned int mb_list = smem_addr(&misc->mb_list);
  if (tid == 0) {
    mbar_init(mb_win, 1);
    mbar_init(mb_cnt, 1);
    mbar_init(mb_list, 1);
    mbar_expect(mb_win, CL * kWinWords * 4);
    mbar_expect(mb_cnt, CL * 4);
    misc->nloc = 0;
    misc->thr = 0;
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  for (int b = tid; b < kBins; b += kThreads) hist[b] = 0;
  if (tid < kHalfGroups) misc->sh[tid] = 0;
  long long L = seq_2d ? static_cast<long long>(seq)
                       : static_cast<long long>(seq) - next_n + (row % next_n) + 1;
  if (L < 0) L = 0;
  if (L > ncols) L = ncols;
  int* out = indices + static_cast<long long>(row) * K;

  if (L <= K) {
    // Short row: 0..L-1 then -1.  No DSMEM, so blocks may leave independently.
    constexpr int kShare = K / CL;
    for (int s = rank * kShare + tid; s < (rank + 1) * kShare; s += kThreads)
      out[s] = (s < L) ? s : -1;
    return;
  }

  const int Li = static_cast<int>(L);
  const int cs = slice_cols<CL>(Li);
  const int start = rank * cs;
  int n = Li - start;
  n = n < 0 ? 0 : (n > cs ? cs : n);
  const float* rowp = logits + static_cast<long long>(row) * stride0;
  const float* chunk = rowp + static_cast<long long>(start) * stride1;
  // Quads (4 keys) held in registers; entries from 4*nq on are the tail.
  constexpr int kHeldQuads = Regs<CL, kAny>::kKeys / 4;
  const int nq = (n >> 2) < kHeldQuads ? (n >> 2) : kHeldQuads;
  const int tail0 = 4 * nq;


  RS8_MARK(0);
  RS8_STAMP(1);
  if (RS8_LEAVE(6)) {  // probe: launch + prologue
    if (tid == 0) out[rank] = Li;
    return;
  }
  // ---- 1. load keys into registers; histogram of per-thread maxima ---------
  // Entries past the slice load as 0xffffffff, key 0 (the smallest): they
  // never raise a maximum, and the collect step skips them by index.
  unsigned int kq[kQuads][4];
  const bool vec = !kAny || (stride1 == 1 && (reinterpret_cast<uintptr_t>(chunk) & 15) == 0);
  if (vec) {
    const float4* src = reinterpret_cast<const float4*>(chunk);
#pragma unroll
    for (int u = 0; u < kQuads; ++u) {
      const int v = tid + u * kThreads;
      const float nanbits = __uint_as_float(0xffffffffu);
      float4 f = make_float4(nanbits, nanbits, nanbits, nanbits);
      if (v < nq) f = load_quad(src + v);  // all of a thread's loads in flight at once
      kq[u][0] = __float_as_uint(f.x);
      kq[u][1] = __float_as_uint(f.y);
      kq[u][2] = __float_as_uint(f.z);
      kq[u][3] = __float_as_uint(f.w);
    }
  } else if constexpr (kAny) {
#pragma unroll
    for (int u = 0; u < kQuads; ++u) {
      const int v = tid + u * kThreads;
#pragma unroll
      for (int c = 0; c < 4; ++c)
        kq[u][c] = (v < nq) ? load_bits(chunk + static_cast<long long>(4 * v + c) * stride1)
                            : 0xffffffffu;
    }
  }
  __syncthreads();  // hist zeroed, misc set (the loads above stay in flight)
  unsigned int mx = 0;
  bool has = tid < nq;
  // Quads no lane of this warp holds are skipped (warp-uniform): a short slice
  // uses fewer than kQuads.  Lanes past the slice in a held quad see key 0.
  const int wbase = tid & ~31;
#pragma unroll
  for (int u = 0; u < kQuads; ++u) {
    if (u * kThreads + wbase < nq) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        kq[u][c] = to_key(kq[u][c]);
        mx = kq[u][c] > mx ? kq[u][c] : mx;
      }
    }
  }
  // Tail (long slices with small clusters): streamed, only its maximum kept.
  auto see_max = [&](int, unsigned int k) {
    mx = k > mx ? k : mx;
    has = true;
  };
  if constexpr (kAny)
    scan_tail<RS8_TAIL0, kThreads>(chunk, stride1, vec, tail0, n, tid, see_max);
  else
    scan_last(chunk, tail0, n, tid, see_max);
  if (has) atomicAdd(&hist[bucket(mx)], 1u);
  __syncthreads();
  if (RS8_LEAVE(5)) {  // probe: + load, maxima histogram
    if (tid == 0) out[rank] = static_cast<int>(hist[bucket(mx)]);
    return;
  }
  RS8_STAMP(2);
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");  // every block is running
  // ---- 2. threshold T: one DSMEM round of histogram windows ---------------
  // The cut is the bin c holding the K-th largest per-thread maximum of the
  // cluster, and T its lower edge: at least K maxima, so K keys, are >= T.
  // Each block sends the suffix counts of a window of its own histogram around
  // its estimate of c; from every block's window each block takes, per bin c,
  // a lower bound of the cluster's maxima >= c (exact where c lies in every
  // window, as it does for every row shape research/rs8_candidates.py models)
  // and the highest c whose bound reaches K.  A bound only lowers c, so T is
  // safe whatever the windows; all blocks compute it from the same words.
  // Suffix counts per half-group (16 bins) by shared atomics, not scans: warp
  // w adds its four half-group sums to every suffix they belong to.
  for (int w = tid >> 5; w < 16; w += kWarps) {
    const unsigned int x = hist[32 * w + lane], y = hist[32 * (w + 16) + lane];
    const unsigned int x0 = __reduce_add_sync(0xffffffffu, lane < 16 ? x : 0u);
    const unsigned int x1 = __reduce_add_sync(0xffffffffu, lane < 16 ? 0u : x);
    const unsigned int y0 = __reduce_add_sync(0xffffffffu, lane < 16 ? y : 0u);
    const unsigned int y1 = __reduce_add_sync(0xffffffffu, lane < 16 ? 0u : y);
    // Half-groups 2w, 2w + 1 (x) and 2w + 32, 2w + 33 (y); lane j adds to sh[j], sh[j + 32].
    const unsigned int lo = (lane <= 2 * w ? x0 : 0u) + (lane <= 2 * w + 1 ? x1 : 0u) + y0 + y1;
    const unsigned int hi = (lane <= 2 * w ? y0 : 0u) + (lane <= 2 * w + 1 ? y1 : 0u);
    if (lo) atomicAdd(&misc->sh[lane], lo);
    if (hi) atomicAdd(&misc->sh[lane + 32], hi);
  }
  __syncthreads();
  if (tid < 32) {
    // This block's estimate: the half-group h holding its (K/CL)-th largest maximum.
    constexpr unsigned int m = K / CL;
    const unsigned int a0 = misc->sh[2 * lane], a1 = misc->sh[2 * lane + 1];
    const unsigned int a2 = lane < 31 ? misc->sh[2 * lane + 2] : 0u;
    const unsigned int b0 = __ballot_sync(0xffffffffu, a0 >= m && a1 < m);
    const unsigned int b1 = __ballot_sync(0xffffffffu, a1 >= m && a2 < m);
    const int h = b0 ? 2 * (__ffs(b0) - 1) : (b1 ? 2 * (__ffs(b1) - 1) + 1 : 0);
    int w0 = 16 * h - kWinBelow;
    w0 = w0 < 0 ? 0 : (w0 > kBins - kWin ? kBins - kWin : w0);
    // Suffix counts: s(lane) = maxima in bins >= w0 + lane; past = in bins >= w0 + kWin.
    const int top = w0 + kWin;
    const int hq = top >> 4, r = top & 15;
    const unsigned int part = __reduce_add_sync(
        0xffffffffu, (lane >= r && lane < 16 && hq < kHalfGroups) ? hist[16 * hq + lane] : 0u);
    const unsigned int past = part + (hq + 1 < kHalfGroups ? misc->sh[hq + 1] : 0u);
    const unsigned int sfx = past + warp_suffix_incl(hist[w0 + lane], lane);
    // Word j: halves 2j and 2j + 1 of [s(0) .. s(31), past, w0].
    const unsigned int h0 = __shfl_sync(0xffffffffu, sfx, (2 * lane) & 31);
    const unsigned int h1 = __shfl_sync(0xffffffffu, sfx, (2 * lane + 1) & 31);
    const unsigned int word =
        lane < 16 ? (h0 | (h1 << 16)) : (past | (static_cast<unsigned int>(w0) << 16));
    if (lane < kWinWords) {
      const unsigned int dst = smem_addr(&misc->win_all[rank][lane]);
#pragma unroll
      for (int q = 0; q < CL; ++q) push_u32(peer_addr(dst, q), word, peer_addr(mb_win, q));
    }
    RS8_MARK(1);
    mbar_wait(mb_win);
    if (RS8_LEAVE(1)) {  // probe: load + window round
      if (lane == 0) out[rank] = static_cast<int>(misc->win_all[0][0]);
    } else {
      RS8_MARK(2);
      const unsigned short* wh = reinterpret_cast<const unsigned short*>(misc->win_all);
      constexpr int kHalves = 2 * kWinWords;
      int wq[CL];
      int wlo = kBins, whi = 0;
#pragma unroll
      for (int q = 0; q < CL; ++q) {
        wq[q] = wh[q * kHalves + kWin + 1];
        wlo = wq[q] < wlo ? wq[q] : wlo;
        whi = wq[q] > whi ? wq[q] : whi;
      }
      // Bound at bin c: block q's maxima >= max(c, wq) when c <= wq + kWin, else 0.
      // Bins above whi + kWin bound to 0; below wlo the bound is constant.
      unsigned int thr = 0;
      for (int cbase = whi + kWin - 31; cbase + 31 >= wlo; cbase -= 32) {
        const int c = cbase + lane;
        unsigned int lb = 0;
#pragma unroll
        for (int q = 0; q < CL; ++q) {
          const int j = c - wq[q];
          if (j <= kWin) lb += wh[q * kHalves + (j < 0 ? 0 : j)];
        }
        const unsigned int hit = __ballot_sync(
            0xffffffffu, c >= 0 && c < kBins && lb >= static_cast<unsigned int>(K));
        if (hit) {
          thr = bucket_lo(static_cast<unsigned int>(cbase + 31 - __clz(hit)));
          break;
        }
      }
      // No bin reaches K (fewer than K maxima seen: short rows): T = 0, every key.
      if (lane == 0) misc->thr = thr;
    }
  }
  if (RS8_LEAVE(1)) return;
  RS8_WSTAMP(0, rs8_gtime());
  __syncthreads();
  const unsigned int thr = misc->thr;
  RS8_WSTAMP(1, rs8_gtime_after(thr));
  RS8_MARK(3);
  RS8_STAMP(3);
  if (RS8_LEAVE(2)) {  // probe: + threshold
    if (tid == 0) out[rank] = static_cast<int>(thr);
    return;
  }

  // ---- 3. collect keys >= T, sort them, push the list to every block -------
  // Two 32-bit stores (the composite's low then high word) rather than one
  // 64-bit value: keeps the keys out of register pairs (fewer spills).
  unsigned int* U32 = reinterpret_cast<unsigned int*>(U);
  auto push = [&](int i, unsigned int k) {
    const unsigned int e = atomicAdd(&misc->nloc, 1u);
    if (e < static_cast<unsigned int>(kSegCap)) {
      U32[2 * e] = ~static_cast<unsigned int>(start + i);
      U32[2 * e + 1] = k;
    }
  };
#pragma unroll
  for (int u = 0; u < kQuads; ++u) {
    if (u * kThreads + wbase < nq) {
      const bool held = tid + u * kThreads < nq;
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (held && kq[u][c] >= thr) push(4 * (tid + u * kThreads) + c, kq[u][c]);
    }
  }
  auto see_key = [&](int i, unsigned int k) {
    if (k >= thr) push(i, k);
  };
  if constexpr (kAny)
    scan_tail<8, kThreads>(chunk, stride1, vec, tail0, n, tid, see_key);
  else
    scan_last(chunk, tail0, n, tid, see_key);
#ifdef RS8_TSTAMP
  __syncwarp();  // the warp's last atomic and stores issued
  RS8_WSTAMP(2, rs8_gtime_after(*reinterpret_cast<volatile unsigned int*>(&misc->nloc)));
#endif
  __syncthreads();
  const unsigned int nloc = misc->nloc;
  RS8_WSTAMP(3, rs8_gtime_after(nloc));
  RS8_MARK(4);
  RS8_STAMP(4);
  if (RS8_LEAVE(3)) {  // probe: + collect
    if (tid == 0) out[rank] = static_cast<int>(nloc);
    return;
  }
  const bool fits = nloc <= static_cast<unsigned int>(kSegCap);
  if (tid < CL)
    push_u32(peer_addr(smem_addr(&misc->segn[rank]), tid), fits ? nloc : 0xffffffffu,
             peer_addr(mb_cnt, tid));
  if (fits) {
    // Rank sort inside the block, G threads per entry: entry e goes to slot
    // #(entries greater) of the list this block owns in every block.
    // G = kThreads / (nloc rounded up to a power of 2), between 1 and 32.
    const int lgp = nloc <= 32u ? 5 : 32 - __clz(nloc - 1u);
    const int lg = (kLgThreads - lgp) < 0 ? 0 : (kLgThreads - lgp > 5 ? 5 : kLgThreads - lgp);
    const unsigned int G = 1u << lg;
    const unsigned int g = tid & (G - 1u);
    // Warp-uniform passes: a warp whose entries all lie past nloc stops (it
    // would compare a dummy against every entry: NOTES.md run 47).
    const unsigned int per = static_cast<unsigned int>(kThreads) >> lg;  // entries per pass
    for (unsigned int w0 = (static_cast<unsigned int>(tid) & ~31u) >> lg; w0 < nloc; w0 += per) {
      const unsigned int e = w0 + (static_cast<unsigned int>(lane) >> lg);
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
      if (e < nloc) {
        // Own slot locally; the key alone to every other block.
        if (g == 0) S[gt] = me;
        const unsigned int dst = smem_addr(seg + rank * kSegStride + gt);
        for (unsigned int q = g; q < static_cast<unsigned int>(CL); q += G)
          if (q != static_cast<unsigned int>(rank))
            push_u32(peer_addr(dst, static_cast<int>(q)), static_cast<unsigned int>(me >> 32),
                     peer_addr(mb_list, static_cast<int>(q)));
      }
    }
  }
  RS8_MARK(5);
  // Every block's count, then every list (expected bytes known from the counts).
  mbar_wait(mb_cnt);
  RS8_MARK(6);
  bool fast = true;
  unsigned int total = 0, longest = 0;
#pragma unroll
  for (int q = 0; q < CL; ++q) {
    const unsigned int c = misc->segn[q];
    fast = fast && c != 0xffffffffu;
    total += (c != 0xffffffffu) ? c : 0u;
    longest = c != 0xffffffffu && c > longest ? c : longest;
  }
  // Keys from every other block that fit (a block that overflowed pushed none).
  if (tid == 0) mbar_expect(mb_list, (total - (fits ? nloc : 0u)) * 4u);
  // The rank step's shape, known from the counts alone: kLpt lists per thread,
  // searched side by side (independent chains), kTpe threads per entry, and
  // every search the same number of steps.
  // (Measured, NOTES.md run 67: 2 lists per thread with 16 blocks, 1 with 8, and
  // all 4 with 4, one thread per entry, 1.3-2.4% faster at 8 requests than 1.)
#ifndef RS8_LPT
#define RS8_LPT 0  // probe: lists per thread in the rank (0: the measured default)
#endif
  constexpr int kLpt =
      RS8_LPT ? (RS8_LPT < CL ? RS8_LPT : CL) : (CL >= 16 ? 2 : (CL == 4 ? 4 : 1));
  constexpr int kTpe = CL / kLpt;
  const int sub = tid % kTpe;
  unsigned int len[kLpt];
#pragma unroll
  for (int i = 0; i < kLpt; ++i) {
    const int q = sub + i * kTpe;
    len[i] = q == rank ? 0u : misc->segn[q];
  }
  const unsigned int top = longest ? 1u << (31 - __clz(longest)) : 0u;
  __syncthreads();     // S, written locally, complete
  RS8_MARK(7);
  mbar_wait(mb_list);  // also when falling back: nothing may land in reused bytes later
  RS8_MARK(8);
  RS8_STAMP(5);
#ifdef RS8_TIMING
  if (row == 0 && rank == 0 && tid == 0) g_rs8_clock[0][14] = total;  // row 0's candidates
#endif
  if (RS8_LEAVE(4)) {  // probe: + sort, list exchange
    if (tid == 0) out[rank] = static_cast<int>(total);
    return;
  }

  // ---- 4. rank own entries against all lists; write indices ----------------
  if (fast && total >= static_cast<unsigned int>(K)) {
    constexpr unsigned int kEpp = kThreads / kTpe;  // entries per pass
    // Warp-uniform passes, as in the sort: warps past nloc stop.
    for (unsigned int w0 = (static_cast<unsigned int>(tid) & ~31u) / kTpe; w0 < nloc; w0 += kEpp) {
      const unsigned int e = w0 + static_cast<unsigned int>(lane) / kTpe;
      unsigned int gt = 0;
      unsigned long long me = 0;
      if (e < nloc) {
        me = S[e];
        // a[i]: entries of list q above me (a larger key, or the same key at a
        // lower position, which is every tie when q < rank), branch-free.
        const unsigned int mk = static_cast<unsigned int>(me >> 32);
        unsigned int a[kLpt];
#pragma unroll
        for (int i = 0; i < kLpt; ++i) a[i] = 0;
        for (unsigned int step = top; step != 0; step >>= 1) {
#pragma unroll
          for (int i = 0; i < kLpt; ++i) {
            const int q = sub + i * kTpe;
            const unsigned int idx = a[i] + step;
            if (idx <= len[i]) {
              const unsigned int v = seg[q * kSegStride + idx - 1];
              if (v > mk || (q < rank && v == mk)) a[i] = idx;
            }
          }
        }
#pragma unroll
        for (int i = 0; i < kLpt; ++i) gt += (sub + i * kTpe == rank) ? e : a[i];
      }
#pragma unroll
      for (int off = 1; off < kTpe; off <<= 1) gt += __shfl_xor_sync(0xffffffffu, gt, off);
      if (sub == 0 && e < nloc && gt < static_cast<unsigned int>(K) &&
          (RS8_PROBE != 3 || gt == static_cast<unsigned int>(ncols)))
        out[gt] = position_of(me);
    }
    RS8_MARK(9);
#ifdef RS8_TSTAMP
    __syncthreads();
    RS8_STAMP(6);
    if (blockIdx.x < kStampBlocks) {
      unsigned int sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      if (tid == 0) {
        for (int i = 0; i < 7; ++i) g_rs8_stamp[blockIdx.x][i] = rs8_ts[i];
        g_rs8_stamp[blockIdx.x][7] = sm;
      }
      if (lane == 0)
        for (int i = 0; i < 4; ++i) g_rs8_wstamp[blockIdx.x][tid >> 5][i] = rs8_wts[i];
    }
#endif
    return;
  }
  // Too many candidates in some block: every block takes the general path.
#ifdef RS8_TIMING
  if (rank == 0 && tid == 0) {  // count rows on the general path
    atomicAdd(reinterpret_cast<unsigned long long*>(&g_rs8_clock[0][15]), 1ull);
  }
#endif
  general_path<K, CL>(cluster, smem, misc, chunk, stride1, n, start, Li, out, rank);
}

// Launch configuration for CL blocks per row (cluster dimension set at launch).
template <int K, int CL>
cudaLaunchConfig_t config(unsigned int blocks, cudaStream_t stream, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(Block<CL>::kThreads);
  cfg.dynamicSmemBytes = Plan<K, CL>::kSmemBytes;
  cfg.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = CL;
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

// Clusters of CL blocks that fit on the device at once (0 if none, or on error).
template <int K, int CL, bool kAny>
int resident_clusters() {
  if (cudaFuncSetAttribute(topk_decode_kernel<K, CL, kAny>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           Plan<K, CL>::kSmemBytes) != cudaSuccess ||
      (CL > 8 && cudaFuncSetAttribute(topk_decode_kernel<K, CL, kAny>,
                                      cudaFuncAttributeNonPortableClusterSizeAllowed,
                                      1) != cudaSuccess)) {
    cudaGetLastError();
    return 0;
  }
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t cfg = config<K, CL>(CL * 64, nullptr, &attr);
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, topk_decode_kernel<K, CL, kAny>, &cfg) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}
// Both kernels of a cluster size (attributes set on each): the fewer that fit.
template <int K, int CL>
int resident_clusters_both() {
  const int any = resident_clusters<K, CL, true>();
  const int fast = resident_clusters<K, CL, false>();
  return any < fast ? any : fast;
}

#ifndef RS8_ALWAYS_ANY
#define RS8_ALWAYS_ANY 0  // A/B builds only: every call takes the kAny kernel
#endif
// Whether every row of the call suits the kAny = false kernel on CL blocks:
// contiguous rows whose every slice starts on 16 bytes (slices start at
// multiples of 4 columns), and slices (rounded up to 4 columns, as the kernel
// cuts them, for the longest row ncols allows) that the registers hold whole.
template <int CL>
bool fast_rows(const float* logits, long long stride0, int stride1, int ncols) {
  const long long cs = slice_cols<CL>(static_cast<long long>(ncols));
  return !RS8_ALWAYS_ANY && stride1 == 1 && stride0 % 4 == 0 &&
         (reinterpret_cast<uintptr_t>(logits) & 15) == 0 && cs <= Regs<CL, false>::kKeys;
}

template <int K, int CL>
cudaError_t launch_cl(const float* logits, long long stride0, int stride1, int ncols,
                      const int* seq_lens, int seq_2d, int next_n, int* indices, int num_rows,
                      cudaStream_t stream) {
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg =
      config<K, CL>(static_cast<unsigned int>(num_rows) * CL, stream, &attr);
  if (fast_rows<CL>(logits, stride0, stride1, ncols))
    return cudaLaunchKernelEx(&cfg, topk_decode_kernel<K, CL, false>, logits, stride0, stride1,
                              ncols, seq_lens, seq_2d, next_n, indices);
  return cudaLaunchKernelEx(&cfg, topk_decode_kernel<K, CL, true>, logits, stride0, stride1, ncols,
                            seq_lens, seq_2d, next_n, indices);
}

// Each row gets the largest cluster (16 blocks where the device allows it,
// then 8) with which every row fits on the device at once: one wave of
// smaller clusters beats waves of larger ones.  Otherwise 4 blocks, in waves
// when needed (2-block clusters measured far slower: with only 1,024
// per-thread maxima over ~100 keys each, the threshold is loose and blocks
// overflow into the general path).  The choice depends only on the row count
// and the device, so a captured graph stays valid.
template <int K>
cudaError_t launch(const float* logits, long long stride0, int stride1, int ncols,
                   const int* seq_lens, int seq_2d, int next_n, int* indices, int num_rows,
                   cudaStream_t stream) {
  static int fit16[64] = {}, fit8[64] = {};
  static bool ready[64] = {};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 0 || dev >= 64) return cudaErrorInvalidDevice;
  if (!ready[dev]) {
    if (resident_clusters_both<K, 4>() == 0) return cudaErrorInvalidConfiguration;
    fit16[dev] = resident_clusters_both<K, 16>();
    fit8[dev] = resident_clusters_both<K, 8>();
    ready[dev] = true;
  }
#ifdef RS8_FORCE_CLUSTER
  constexpr int kForce = RS8_FORCE_CLUSTER;
#else
  constexpr int kForce = 0;
#endif
  if (kForce == 16 || (kForce == 0 && num_rows <= fit16[dev]))
    return launch_cl<K, 16>(logits, stride0, stride1, ncols, seq_lens, seq_2d, next_n, indices,
                            num_rows, stream);
  if (kForce == 8 || (kForce == 0 && num_rows <= fit8[dev]))
    return launch_cl<K, 8>(logits, stride0, stride1, ncols, seq_lens, seq_2d, next_n, indices,
                           num_rows, stream);
  return launch_cl<K, 4>(logits, stride0, stride1, ncols, seq_lens, seq_2d, next_n, indices,
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
  if (next_n <= 0 || stride0 < 0 || stride1 <= 0 || stride1 > INT_MAX)
    return static_cast<int>(cudaErrorInvalidValue);
  // Rows are at most INT_MAX long (seq_lens are int32), so a wider buffer
  // changes nothing once clamped.
  const int nc = ncols > INT_MAX ? INT_MAX : static_cast<int>(ncols < 0 ? 0 : ncols);
  const int s1 = static_cast<int>(stride1);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (k) {
    case 512:
      return rs8::launch<512>(logits, stride0, s1, nc, seq_lens, seq_2d, next_n, indices,
                              num_rows, s);
    case 1024:
      return rs8::launch<1024>(logits, stride0, s1, nc, seq_lens, seq_2d, next_n,
                               indices, num_rows, s);
    case 2048:
      return rs8::launch<2048>(logits, stride0, s1, nc, seq_lens, seq_2d, next_n,
                               indices, num_rows, s);
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

// Keys one block holds in registers with cl blocks per row (16, 8 or 4; 0 if k
// or cl is unsupported): a longer slice streams the rest (the tail path), and
// tests probe the edges.
int rs8_block_keys(int k, int cl) {
  if (k != 512 && k != 1024 && k != 2048) return 0;
  switch (cl) {
    case 16:
      return rs8::Regs<16>::kKeys;
    case 8:
      return rs8::Regs<8>::kKeys;
    case 4:
      return rs8::Regs<4>::kKeys;
    default:
      return 0;
  }
}

// Keys one block of an 8-block cluster holds in registers (0 if k unsupported).
int rs8_cache_keys(int k) { return rs8_block_keys(k, rs8::kCluster); }

// Blocks per row with the portable cluster size (16 where the device allows it
// and the rows fit at once).
int rs8_cluster_size(void) { return rs8::kCluster; }

#ifdef RS8_TSTAMP
// Copy the last call's stamps: blocks x 8 and blocks x 32 warps x 4 uint64.
int rs8_read_stamps(unsigned long long* blocks, unsigned long long* warps) {
  cudaError_t e = cudaMemcpyFromSymbol(blocks, rs8::g_rs8_stamp, sizeof(rs8::g_rs8_stamp));
  if (e == cudaSuccess)
    e = cudaMemcpyFromSymbol(warps, rs8::g_rs8_wstamp, sizeof(rs8::g_rs8_wstamp));
  return static_cast<int>(e);
}
#endif

#ifdef RS8_TIMING
// Copy row 0's stage clocks (16 blocks x 16 int64) to host memory.
int rs8_read_clocks(long long* host) {
  return static_cast<int>(
      cudaMemcpyFromSymbol(host, rs8::g_rs8_clock, sizeof(rs8::g_rs8_clock)));
}
#endif

}  // extern "C"
