// launch_cost.cu - host-side kernel launch cost microbenchmark (Hopper, sm_90a).
//
// What it measures: the host wall time spent inside ONE launch call (runtime or
// driver API) for an empty kernel taking a 384-byte __grid_constant__ parameter
// struct, grid 132 x 256, 0 dynamic smem, on a non-blocking stream. It compares
// the launch paths our launcher could use: classic cudaLaunchKernel,
// cudaLaunchKernelExC (with/without the PDL attribute), cudaLaunchKernelExC on a
// cudaKernel_t (what we do with kernels from cudaLibraryGetKernel), the same with the
// cooperative attribute, alone and with PDL (our launch since the merge moved into the
// attention kernel), cuLaunchKernelEx on a CUfunction / on a CUkernel, and classic
// cuLaunchKernel.
// Only the launch call is timed (steady_clock before/after), not GPU execution.
//
// Build: nvcc -std=c++17 -O2 -arch=sm_90a -o launch_cost launch_cost.cu -lcuda
// Run:   ./launch_cost            (uses device 0; pin with taskset for stabler numbers)
// Output: one line per variant: median and 10th percentile, microseconds.
#include <cuda.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

// 384-byte, 64-byte-aligned parameter block, mimicking our real kernels' Params
// (the argument size affects how much the driver has to copy per launch).
struct alignas(64) Params {
  uint8_t data[128];
  float scale[32];
  int flag;
  int pad[31];
};
static_assert(sizeof(Params) == 384, "Params must be 384 bytes");

// Does nothing observable; the impossible trap keeps p from being optimized out.
extern "C" __global__ void empty_kernel(const __grid_constant__ Params p) {
  if (p.flag == 12345) asm volatile("trap;");
}

static const dim3 kGrid(132), kBlock(256);
static const int kWarmup = 200, kBursts = 30, kPerBurst = 100;

// Error -> message (nullptr on success), so every variant reports uniformly.
static const char* rtErr(cudaError_t e) { return e == cudaSuccess ? nullptr : cudaGetErrorString(e); }
static const char* drvErr(CUresult r) {
  if (r == CUDA_SUCCESS) return nullptr;
  const char* s = nullptr;
  cuGetErrorString(r, &s);
  return s ? s : "unknown CUresult";
}

// Runs one variant. `launch` performs exactly one launch and returns nullptr or
// an error string. It is a template (not std::function) so the only thing
// between the two clock reads is the launch call itself, inlined.
template <class F>
static void bench(const char* name, cudaStream_t s, F&& launch) {
  const char* err = nullptr;
  // Warm-up: first launches pay for lazy module loading / context setup.
  for (int i = 0; i < kWarmup && !err; ++i) err = launch();
  if (!err) err = rtErr(cudaStreamSynchronize(s));
  if (err) {
    printf("%-52s ERROR (warm-up): %s\n", name, err);
    cudaGetLastError();  // clear non-sticky error, go on to the next variant
    return;
  }
  std::vector<double> us;
  us.reserve(kBursts * kPerBurst);
  for (int b = 0; b < kBursts && !err; ++b) {
    for (int i = 0; i < kPerBurst; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      err = launch();
      auto t1 = std::chrono::steady_clock::now();
      if (err) break;
      us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    // Drain after every burst so the launch queue never fills up (a full queue
    // would make launches block and measure GPU throughput instead).
    if (!err) err = rtErr(cudaStreamSynchronize(s));
  }
  if (err) {
    printf("%-52s ERROR: %s\n", name, err);
    cudaGetLastError();
    return;
  }
  std::sort(us.begin(), us.end());
  printf("%-52s %7.2f us   (p10 %6.2f us, n=%zu)\n", name, us[us.size() / 2],
         us[us.size() / 10], us.size());
}

#define CHECK_RT(call)                                                          \
  do {                                                                          \
    cudaError_t e_ = (call);                                                    \
    if (e_ != cudaSuccess) {                                                    \
      printf("setup call %s failed: %s\n", #call, cudaGetErrorString(e_));     \
      return 1;                                                                 \
    }                                                                           \
  } while (0)

int main() {
  CHECK_RT(cudaSetDevice(0));
  CHECK_RT(cudaFree(0));  // create the primary context so driver-API calls below work
  cudaDeviceProp prop{};
  int drv = 0, rt = 0;
  CHECK_RT(cudaGetDeviceProperties(&prop, 0));
  CHECK_RT(cudaDriverGetVersion(&drv));
  CHECK_RT(cudaRuntimeGetVersion(&rt));
  printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor,
         prop.multiProcessorCount);
  printf("driver version: %d, runtime version: %d\n", drv, rt);
  printf("kernel: 384-byte __grid_constant__ params, grid %u x %u, 0 smem; "
         "%d bursts x %d launches\n\n", kGrid.x, kBlock.x, kBursts, kPerBurst);

  cudaStream_t s;
  CHECK_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUstream cs = reinterpret_cast<CUstream>(s);

  Params p{};
  p.flag = 0;
  void* args[] = {&p};

  // Handles for the non-<<<>>> paths. Failures here are reported per variant.
  cudaKernel_t kern = nullptr;  // context-independent handle (like cudaLibraryGetKernel)
  cudaFunction_t fn = nullptr;  // per-context function handle
  const char* kernErr = rtErr(cudaGetKernel(&kern, (const void*)empty_kernel));
  const char* fnErr = rtErr(cudaGetFuncBySymbol(&fn, (const void*)empty_kernel));
  if (kernErr) printf("cudaGetKernel failed: %s\n", kernErr);
  if (fnErr) printf("cudaGetFuncBySymbol failed: %s\n", fnErr);
  CUfunction cuFn = reinterpret_cast<CUfunction>(fn);
  // CUDA 12+: a CUkernel may be passed wherever launch APIs take a CUfunction.
  CUfunction cuKern = reinterpret_cast<CUfunction>(kern);

  // Runtime launch configs: plain and with PDL (programmatic stream serialization).
  cudaLaunchAttribute pdl{};
  pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = kGrid; cfg.blockDim = kBlock; cfg.dynamicSmemBytes = 0; cfg.stream = s;
  cudaLaunchConfig_t cfgPdl = cfg;
  cfgPdl.attrs = &pdl; cfgPdl.numAttrs = 1;
  // Cooperative (all CTAs resident at once), alone and with PDL.
  cudaLaunchAttribute coop[2];
  coop[0].id = cudaLaunchAttributeCooperative;
  coop[0].val.cooperative = 1;
  coop[1] = pdl;
  cudaLaunchConfig_t cfgCoop = cfg;
  cfgCoop.attrs = coop; cfgCoop.numAttrs = 1;
  cudaLaunchConfig_t cfgCoopPdl = cfg;
  cfgCoopPdl.attrs = coop; cfgCoopPdl.numAttrs = 2;

  // Driver launch configs, same two flavours.
  CUlaunchAttribute cuPdl{};
  cuPdl.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  cuPdl.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig ccfg{};
  ccfg.gridDimX = kGrid.x; ccfg.gridDimY = 1; ccfg.gridDimZ = 1;
  ccfg.blockDimX = kBlock.x; ccfg.blockDimY = 1; ccfg.blockDimZ = 1;
  ccfg.sharedMemBytes = 0; ccfg.hStream = cs;
  CUlaunchConfig ccfgPdl = ccfg;
  ccfgPdl.attrs = &cuPdl; ccfgPdl.numAttrs = 1;

  const void* sym = (const void*)empty_kernel;

  // 1. Classic runtime launch on the statically linked kernel.
  bench("cudaLaunchKernel static kernel", s,
        [&] { return rtErr(cudaLaunchKernel(sym, kGrid, kBlock, args, 0, s)); });
  // 2./3. Extensible runtime launch, without / with the PDL attribute.
  bench("cudaLaunchKernelExC static kernel, no attr", s,
        [&] { return rtErr(cudaLaunchKernelExC(&cfg, sym, args)); });
  bench("cudaLaunchKernelExC static kernel, PDL attr", s,
        [&] { return rtErr(cudaLaunchKernelExC(&cfgPdl, sym, args)); });
  // 4. cudaKernel_t passed as the func pointer: our library-kernel launch path.
  auto kernLaunch = [&](const cudaLaunchConfig_t* c) {
    return kernErr ? kernErr : rtErr(cudaLaunchKernelExC(c, (const void*)kern, args));
  };
  bench("cudaLaunchKernelExC cudaKernel_t, no attr", s, [&] { return kernLaunch(&cfg); });
  bench("cudaLaunchKernelExC cudaKernel_t, PDL attr", s, [&] { return kernLaunch(&cfgPdl); });
  bench("cudaLaunchKernelExC cudaKernel_t, cooperative", s, [&] { return kernLaunch(&cfgCoop); });
  bench("cudaLaunchKernelExC cudaKernel_t, cooperative + PDL", s,
        [&] { return kernLaunch(&cfgCoopPdl); });
  // 5. Driver extensible launch on the CUfunction, then on the CUkernel.
  bench("cuLaunchKernelEx CUfunction, no attr", s, [&] {
    return fnErr ? fnErr : drvErr(cuLaunchKernelEx(&ccfg, cuFn, args, nullptr));
  });
  bench("cuLaunchKernelEx CUfunction, PDL attr", s, [&] {
    return fnErr ? fnErr : drvErr(cuLaunchKernelEx(&ccfgPdl, cuFn, args, nullptr));
  });
  bench("cuLaunchKernelEx CUkernel (cudaKernel_t), no attr", s, [&] {
    return kernErr ? kernErr : drvErr(cuLaunchKernelEx(&ccfg, cuKern, args, nullptr));
  });
  bench("cuLaunchKernelEx CUkernel (cudaKernel_t), PDL attr", s, [&] {
    return kernErr ? kernErr : drvErr(cuLaunchKernelEx(&ccfgPdl, cuKern, args, nullptr));
  });
  // 6. Classic driver launch on the CUfunction.
  bench("cuLaunchKernel CUfunction", s, [&] {
    return fnErr ? fnErr
                 : drvErr(cuLaunchKernel(cuFn, kGrid.x, 1, 1, kBlock.x, 1, 1, 0, cs, args, nullptr));
  });

  cudaStreamDestroy(s);
  return 0;
}
