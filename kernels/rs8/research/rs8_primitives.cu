// Costs of the primitives rs8 is built from, on the GPU at hand (one standalone
// program: nvcc -O3 -arch=sm_90a kernels/rs8/research/rs8_primitives.cu -o /tmp/prim && /tmp/prim).
//
// Why: rs8's one-request time is mostly fixed latency (launch, DSMEM exchange
// rounds, block barriers), so the redesign needs each one's price measured
// alone rather than inferred from stage clocks of the whole kernel.
//
//   launch  µs per kernel node in a CUDA graph: plain grid vs 8- and 16-block
//           clusters, 99 KB dynamic shared memory, 512 threads, 96 blocks.
//   round   cycles per all-to-all push round inside a 16-block cluster
//           (st.async counted on the receiver's mbarrier, double-buffered),
//           for message shapes like rs8's (1 word, 32 words, 720 x 8 bytes).
//   pingpong cycles per round trip of one word between two blocks.
//   load    µs per kernel for 96 blocks reading rs8's slice sizes past the L2:
//           float4s into registers vs bulk copies into shared memory.
//   code    the same FMAs as straight-line code (32 / 128 KB) or as a loop:
//           whether instruction fetch costs anything at rs8's code size.
// Results: kernels/rs8/NOTES.md run 31.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

constexpr int kThreads = 512;
constexpr int kSmem = 101376;
constexpr int kRounds = 64;

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ unsigned peer(unsigned a, int q) {
  unsigned r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(q));
  return r;
}
__device__ __forceinline__ void mbar_init(unsigned bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.relaxed.cta.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred p;\nW_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra W_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void push32(unsigned ra, unsigned v, unsigned rb) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.u32 [%0], %1, [%2];" ::"r"(ra),
               "r"(v), "r"(rb)
               : "memory");
}
__device__ __forceinline__ void push64(unsigned ra, unsigned long long v, unsigned rb) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];" ::"r"(ra),
               "l"(v), "r"(rb)
               : "memory");
}
__device__ __forceinline__ void push128(unsigned ra, uint4 v, unsigned rb) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
          ra),
      "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(rb)
      : "memory");
}
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.aligned;\nbarrier.cluster.wait.aligned;" ::: "memory");
}

__global__ void empty_kernel(int* out) {
  if (out && threadIdx.x == 0 && blockIdx.x == 100000) out[0] = 1;
}
__global__ void seq_kernel(const int* seq, int* out) {  // dependent read + one write per block
  const int L = seq[blockIdx.x / 16];
  if (threadIdx.x == 0) out[blockIdx.x] = L;
}
__global__ void barrier_kernel(int* out) {
  cluster_sync_all();
  if (out && threadIdx.x == 0 && blockIdx.x == 100000) out[0] = 1;
}

// Message shapes of one round (per block): 0: lanes 0..CL-1 of warp 0 push one
// word to block lane; 1: warp 0 pushes 32 words to every block (16 per lane, the
// bins round); 2: warp w pushes 32 words to block w (one per thread); 3: 720
// 8-byte pushes over all threads (a 45-entry list to 16 blocks); 4: the same
// bytes as 360 16-byte pushes.
template <int CL>
__device__ unsigned round_bytes(int shape) {
  switch (shape) {
    case 0: return CL * 4;
    case 1: return CL * 128;
    case 2: return CL * 128;
    case 3: return 45 * 8 * CL;
    default: return 45 * 8 * CL + 8 * CL;  // 23 quads per source
  }
}

template <int CL>
__global__ void __launch_bounds__(kThreads, 1) round_kernel(int shape, long long* cycles) {
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned long long* bars = reinterpret_cast<unsigned long long*>(smem);
  unsigned char* data = smem + 64;  // [2][CL][736 bytes]
  constexpr int kSlot = 736;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  const unsigned b0 = smem_addr(&bars[0]), b1 = smem_addr(&bars[1]);
  if (tid == 0) {
    mbar_init(b0);
    mbar_init(b1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster_sync_all();
  const unsigned bytes = round_bytes<CL>(shape);
  long long t0 = clock64();
  for (int r = 0; r < kRounds; ++r) {
    const int buf = r & 1;
    const unsigned bar = buf ? b1 : b0;
    if (tid == 0) mbar_expect(bar, bytes);
    unsigned char* mine = data + (buf * CL + rank) * kSlot;  // my slot in every block
    const unsigned ma = smem_addr(mine);
    if (shape == 0) {
      if (tid < CL) push32(peer(ma, tid), r, peer(bar, tid));
    } else if (shape == 1) {
      if (warp == 0)
        for (int q = 0; q < CL; ++q) push32(peer(ma + 4 * lane, q), r, peer(bar, q));
    } else if (shape == 2) {
      if (warp < CL) push32(peer(ma + 4 * lane, warp), r, peer(bar, warp));
    } else if (shape == 3) {
      for (int p = tid; p < 45 * CL; p += kThreads) {
        const int q = p % CL, e = p / CL;
        push64(peer(ma + 8 * e, q), r, peer(bar, q));
      }
    } else {
      for (int p = tid; p < 23 * CL; p += kThreads) {
        const int q = p % CL, e = p / CL;
        push128(peer(ma + 16 * e, q), make_uint4(r, r, r, r), peer(bar, q));
      }
    }
    mbar_wait(bar, (r >> 1) & 1);
    __syncthreads();  // no thread lags two phases behind (parity aliasing)
  }
  long long t1 = clock64();
  __syncthreads();
  if (tid == 0) cycles[blockIdx.x] = (t1 - t0) / kRounds;
  cluster_sync_all();  // nobody leaves while others may still push
}

__global__ void __cluster_dims__(2, 1, 1) pingpong_kernel(long long* cycles) {
  __shared__ __align__(8) unsigned long long bar;
  __shared__ unsigned word;
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  const unsigned b = smem_addr(&bar);
  if (threadIdx.x == 0) {
    mbar_init(b);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster_sync_all();
  long long t0 = clock64();
  if (threadIdx.x == 0) {
    for (int r = 0; r < kRounds; ++r) {
      mbar_expect(b, 4);
      if (rank == 0) {
        push32(peer(smem_addr(&word), 1), r, peer(b, 1));
        mbar_wait(b, r & 1);
      } else {
        mbar_wait(b, r & 1);
        push32(peer(smem_addr(&word), 0), r, peer(b, 0));
      }
    }
  }
  long long t1 = clock64();
  if (threadIdx.x == 0) cycles[blockIdx.x] = (t1 - t0) / kRounds;
  cluster_sync_all();
}

// Load probes: each block reads `n` floats of its own slice (slices of
// successive nodes lie far apart, so nothing is L2-resident) and writes one max.
// ldg: every thread holds its float4s in registers (rs8 today, all loads in
// flight at once).  tma: one bulk copy per 4 KB chunk into shared memory
// (cp.async.bulk, counted on an mbarrier), then the max from shared memory.
template <int NQ>
__global__ void __launch_bounds__(kThreads, 1) load_ldg(const float* base, int n, float* out) {
  const float4* src = reinterpret_cast<const float4*>(base + static_cast<long long>(blockIdx.x) * n);
  const int nq = n / 4;
  float4 f[NQ];
#pragma unroll
  for (int u = 0; u < NQ; ++u) {
    const int v = threadIdx.x + u * kThreads;
    f[u] = v < nq ? __ldg(src + v) : make_float4(-1e30f, -1e30f, -1e30f, -1e30f);
  }
  float m = -1e30f;
#pragma unroll
  for (int u = 0; u < NQ; ++u) m = fmaxf(m, fmaxf(fmaxf(f[u].x, f[u].y), fmaxf(f[u].z, f[u].w)));
  if (threadIdx.x == 0) out[blockIdx.x] = m;
}
__global__ void __launch_bounds__(kThreads, 1) load_tma(const float* base, int n, float* out) {
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned long long* bar = reinterpret_cast<unsigned long long*>(smem);
  float* buf = reinterpret_cast<float*>(smem + 128);
  const float* src = base + static_cast<long long>(blockIdx.x) * n;
  const unsigned b = smem_addr(bar);
  const unsigned bytes = static_cast<unsigned>(n) * 4u;
  constexpr unsigned kChunk = 4096;
  if (threadIdx.x == 0) {
    mbar_init(b);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    mbar_expect(b, bytes);
  }
  __syncthreads();
  const unsigned nchunks = (bytes + kChunk - 1) / kChunk;
  if (threadIdx.x < nchunks) {
    const unsigned off = threadIdx.x * kChunk;
    const unsigned len = bytes - off < kChunk ? bytes - off : kChunk;
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem_addr(buf) + off),
        "l"(reinterpret_cast<const char*>(src) + off), "r"(len), "r"(b)
        : "memory");
  }
  mbar_wait(b, 0);
  float m = -1e30f;
  const float4* q = reinterpret_cast<const float4*>(buf);
  for (int v = threadIdx.x; v < n / 4; v += kThreads) {
    const float4 f = q[v];
    m = fmaxf(m, fmaxf(fmaxf(f.x, f.y), fmaxf(f.z, f.w)));
  }
  if (threadIdx.x == 0) out[blockIdx.x] = m;
}

// Instruction fetch: the same number of FMAs (4 independent chains) as
// straight-line code of N instructions (16 bytes each) or as a 64-FMA loop body.
template <int N, bool kStraight>
__global__ void code_kernel(float b, float c, float* out) {
  float x0 = threadIdx.x, x1 = x0 + 1.f, x2 = x0 + 2.f, x3 = x0 + 3.f;
  if (kStraight) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      x0 = fmaf(x0, b, c);
      x1 = fmaf(x1, b, c);
      x2 = fmaf(x2, b, c);
      x3 = fmaf(x3, b, c);
    }
  } else {
#pragma unroll 1
    for (int j = 0; j < N / 64; ++j) {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        x0 = fmaf(x0, b, c);
        x1 = fmaf(x1, b, c);
        x2 = fmaf(x2, b, c);
        x3 = fmaf(x3, b, c);
      }
    }
  }
  const float r = x0 + x1 + x2 + x3;
  if (r == 1234.5f) out[0] = r;
}

// Median µs per node over replays of a graph of 40 nodes; launch(s, i)
// enqueues node i on stream s (called once outside the graph as a warm-up).
template <typename L>
float graph_us_nodes(L&& launch) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int nodes = 40;
  launch(s, 0);
  CK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < nodes; ++i) launch(s, i);
  CK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t ge;
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < 25; ++i) {
    CK(cudaEventRecord(a, s));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (i >= 3) t.push_back(ms * 1000.f / nodes);
  }
  std::sort(t.begin(), t.end());
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamDestroy(s));
  return t[t.size() / 2];
}

// Median µs per kernel: every node the same launch of `cfg`.
template <typename... A>
float graph_us(const cudaLaunchConfig_t& cfg0, void (*k)(A...), A... args) {
  return graph_us_nodes([&](cudaStream_t s, int) {
    cudaLaunchConfig_t cfg = cfg0;
    cfg.stream = s;
    CK(cudaLaunchKernelEx(&cfg, k, args...));
  });
}

// As graph_us, but node i reads base + i * stride floats (past the L2).
template <typename K>
float graph_us_cycled(const cudaLaunchConfig_t& cfg0, K k, const float* base, long long stride,
                      int n, float* out) {
  return graph_us_nodes([&](cudaStream_t s, int i) {
    cudaLaunchConfig_t cfg = cfg0;
    cfg.stream = s;
    CK(cudaLaunchKernelEx(&cfg, k, base + i * stride, n, out));
  });
}

cudaLaunchConfig_t make_cfg(int blocks, int cl, int smem, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t c = {};
  c.gridDim = dim3(blocks);
  c.blockDim = dim3(kThreads);
  c.dynamicSmemBytes = smem;
  if (cl > 1) {
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = cl;
    attr->val.clusterDim.y = 1;
    attr->val.clusterDim.z = 1;
    c.attrs = attr;
    c.numAttrs = 1;
  }
  return c;
}

template <typename K>
void allow(K k, int smem, bool nonportable) {
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  if (nonportable) CK(cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
}

template <int CL>
void rounds(int clusters, long long* d_cycles) {
  allow(round_kernel<CL>, kSmem, CL > 8);
  const char* names[] = {"1 word/pair (16 STAS)", "32 words/pair, warp 0 (512 STAS)",
                         "32 words/pair, warp per dest (512 STAS)", "45 x 8 B/pair (720 STAS.64)",
                         "45 x 8 B/pair as 23 x 16 B (368 STAS.128)"};
  for (int shape = 0; shape < 5; ++shape) {
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = make_cfg(clusters * CL, CL, kSmem, &attr);
    std::vector<long long> best;
    for (int rep = 0; rep < 3; ++rep) {
      CK(cudaLaunchKernelEx(&cfg, round_kernel<CL>, shape, d_cycles));
      CK(cudaDeviceSynchronize());
    }
    std::vector<long long> h(clusters * CL);
    CK(cudaMemcpy(h.data(), d_cycles, h.size() * 8, cudaMemcpyDeviceToHost));
    std::sort(h.begin(), h.end());
    printf("round CL=%2d clusters=%d %-44s cycles/round median %lld max %lld\n", CL, clusters,
           names[shape], h[h.size() / 2], h.back());
  }
}

int main() {
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  int clk = 0;
  CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0));
  printf("%s, %d SMs, max SM clock %.0f MHz\n", p.name, p.multiProcessorCount, clk / 1000.0);
  int* d_out;
  int* d_seq;
  long long* d_cycles;
  CK(cudaMalloc(&d_out, 4096 * 4));
  CK(cudaMalloc(&d_seq, 64 * 4));
  CK(cudaMemset(d_seq, 0, 64 * 4));
  CK(cudaMalloc(&d_cycles, 4096 * 8));
  allow(empty_kernel, kSmem, true);
  allow(seq_kernel, kSmem, true);
  allow(barrier_kernel, kSmem, true);
  cudaLaunchAttribute attr;
  struct Row {
    const char* name;
    int blocks, cl, smem;
  } rows[] = {{"plain 96 blocks, no smem", 96, 1, 0},
              {"plain 96 blocks, 99 KB", 96, 1, kSmem},
              {"cluster 8 x 12, 99 KB", 96, 8, kSmem},
              {"cluster 16 x 6, 99 KB", 96, 16, kSmem},
              {"cluster 16 x 6, no smem", 96, 16, 0}};
  for (const Row& r : rows) {
    const cudaLaunchConfig_t c = make_cfg(r.blocks, r.cl, r.smem, &attr);
    const float e = graph_us(c, empty_kernel, d_out);
    const float s = graph_us(c, seq_kernel, static_cast<const int*>(d_seq), d_out);
    float b = -1.f;
    if (r.cl > 1) b = graph_us(c, barrier_kernel, d_out);
    printf("launch %-28s empty %.2f us  seq_lens read+write %.2f us  one cluster barrier %.2f us\n",
           r.name, e, s, b);
  }
  {
    float* big;
    float* d_f;
    const long long stride = 96LL * 12288;  // floats per node: 96 blocks x 48 KB
    CK(cudaMalloc(&big, 41 * stride * 4));
    CK(cudaMemset(big, 0, 41 * stride * 4));
    CK(cudaMalloc(&d_f, 4096 * 4));
    allow(load_ldg<6>, 50000, false);
    allow(load_tma, 50000, false);
    for (int n : {7032, 12000}) {
      cudaLaunchConfig_t c0 = make_cfg(96, 1, 0, &attr);
      const float l = graph_us_cycled(c0, load_ldg<6>, static_cast<const float*>(big), stride, n, d_f);
      cudaLaunchConfig_t c1 = make_cfg(96, 1, 50000, &attr);
      const float t = graph_us_cycled(c1, load_tma, static_cast<const float*>(big), stride, n, d_f);
      cudaLaunchConfig_t c2 = make_cfg(96, 1, 50000, &attr);
      const float l2 = graph_us_cycled(c2, load_ldg<6>, static_cast<const float*>(big), stride, n, d_f);
      printf("load 96 blocks x %5d floats (%.1f MB): ldg->registers %.2f us (with 50 KB smem %.2f), "
             "bulk copy->smem %.2f us\n", n, 96.0 * n * 4 / 1e6, l, l2, t);
    }
  }
  {
    float* d_f;
    CK(cudaMalloc(&d_f, 64));
    for (int threads : {32, 512}) {
      cudaLaunchConfig_t c = make_cfg(96, 1, 0, &attr);
      c.blockDim = dim3(threads);
      const float s2 = graph_us(c, code_kernel<2048, true>, 1.0001f, 0.5f, d_f);
      const float l2 = graph_us(c, code_kernel<2048, false>, 1.0001f, 0.5f, d_f);
      const float s8 = graph_us(c, code_kernel<8192, true>, 1.0001f, 0.5f, d_f);
      const float l8 = graph_us(c, code_kernel<8192, false>, 1.0001f, 0.5f, d_f);
      printf("code %3d threads/block: 2048 FMAs straight (32 KB) %.2f us, looped %.2f us; "
             "8192 straight (128 KB) %.2f us, looped %.2f us\n", threads, s2, l2, s8, l8);
    }
  }
  rounds<16>(1, d_cycles);
  rounds<16>(6, d_cycles);
  rounds<8>(12, d_cycles);
  pingpong_kernel<<<2, 32>>>(d_cycles);
  CK(cudaDeviceSynchronize());
  long long h[2];
  CK(cudaMemcpy(h, d_cycles, 16, cudaMemcpyDeviceToHost));
  printf("pingpong 2 blocks, one word: %lld / %lld cycles per round trip\n", h[0], h[1]);
  return 0;
}
