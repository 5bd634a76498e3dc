// TVM-FFI entry points of jit-mla. This file's only job:
//   1. validate (dtypes and shapes, then consistency, then devices, then arch),
//   2. device guard and stream,
//   3. pick the kernels (loaded from a verified cubin by load_cubin),
//   4. launch and check every launch.
// Dtype and shape checks come before device checks so that a CPU-only machine can exercise them.
#include <cuda.h>
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/container/variant.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>
#include <tvm/ffi/string.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/params.h"
#include "config.h"
#include "sm90/smem_size.h"

namespace {

using tvm::ffi::Bytes;
using tvm::ffi::Optional;
using tvm::ffi::String;
using tvm::ffi::Tensor;
using tvm::ffi::TensorView;
using tvm::ffi::Variant;
using namespace jit_mla;

#define MLA_CHECK(cond, kind) \
  if (!(cond)) TVM_FFI_THROW(kind)

constexpr DLDataType kBF16{kDLBfloat, 16, 1};
constexpr DLDataType kF32{kDLFloat, 32, 1};
constexpr DLDataType kI32{kDLInt, 32, 1};
constexpr DLDataType kFP8E4M3{kDLFloat8_e4m3fn, 8, 1};

bool same_dtype(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

std::string shape_str(const TensorView& t) {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < t.ndim(); ++i) os << (i ? ", " : "") << t.size(i);
  os << "]";
  return os.str();
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

std::string desc(const TensorView& t) {
  std::ostringstream os;
  os << t.dtype() << " " << shape_str(t);
  return os.str();
}

std::vector<int64_t> shape_of(const TensorView& t) {
  std::vector<int64_t> s(t.ndim());
  for (int i = 0; i < t.ndim(); ++i) s[i] = t.size(i);
  return s;
}

void check_dtype(const TensorView& t, DLDataType want, const char* name, const char* want_name) {
  MLA_CHECK(same_dtype(t.dtype(), want), TypeError)
      << name << " must be " << want_name << ", got " << desc(t);
}

void check_shape(const TensorView& t, const std::vector<int64_t>& want, const char* name) {
  MLA_CHECK(shape_of(t) == want, ValueError)
      << name << " must have shape " << shape_str(want) << ", got " << desc(t);
}

std::string strides_str(const TensorView& t) {
  std::ostringstream os;
  os << "(";
  for (int i = 0; i < t.ndim(); ++i) os << (i ? ", " : "") << t.stride(i);
  os << ")";
  return os.str();
}

void check_contiguous(const TensorView& t, const char* name) {
  MLA_CHECK(t.IsContiguous(), ValueError)
      << name << " must be contiguous, got " << desc(t) << " with strides " << strides_str(t);
}

char* data_of(const TensorView& t) { return static_cast<char*>(t.data_ptr()) + t.byte_offset(); }

void check_aligned(const TensorView& t, uintptr_t bytes, const char* name) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(data_of(t));
  MLA_CHECK(addr % bytes == 0, ValueError)
      << name << "'s data pointer must be " << bytes << "-byte aligned, got address 0x" << std::hex << addr
      << std::dec << " (offset " << addr % bytes << " bytes)";
}

// Every tensor argument must sit on the query's CUDA device.
void check_device(const TensorView& t, DLDevice want, const char* name) {
  const DLDevice d = t.device();
  MLA_CHECK(d.device_type == kDLCUDA, ValueError)
      << name << " must be a CUDA tensor, got device type " << int(d.device_type)
      << (d.device_type == kDLCPU ? " (CPU)" : "");
  MLA_CHECK(d.device_id == want.device_id, ValueError)
      << name << " must be on cuda:" << want.device_id << " (the query's device), got cuda:"
      << d.device_id;
}

// A scale is a Python float, or a one-element float32 CUDA tensor the kernel reads itself.
// An undefined Tensor (Python None) must never be dereferenced: check defined() first.
struct Scale {
  float value = 1.f;
  const float* ptr = nullptr;
  Tensor tensor;  // held by value: Variant::get() returns a copy, a reference to it would dangle
};

Scale parse_scale(const Variant<double, Tensor>& v, const char* name) {
  Scale s;
  if (auto d = v.as<double>()) {
    s.value = static_cast<float>(*d);
    return s;
  }
  Tensor t = v.get<Tensor>();
  MLA_CHECK(t.defined(), TypeError)
      << name << " must be a float or a one-element float32 CUDA tensor, got None";
  MLA_CHECK(same_dtype(t.dtype(), kF32), TypeError)
      << name << " tensor must be float32, got " << t.dtype();
  MLA_CHECK(t.numel() == 1, ValueError)
      << name << " tensor must have exactly one element, got " << t.numel();
  s.ptr = reinterpret_cast<const float*>(static_cast<char*>(t.data_ptr()) + t.byte_offset());
  s.tensor = std::move(t);
  return s;
}

void check_scale_device(const Scale& s, DLDevice want, const char* name) {
  if (!s.tensor.defined()) return;
  const DLDevice d = s.tensor.device();
  MLA_CHECK(d.device_type == kDLCUDA && d.device_id == want.device_id, ValueError)
      << name << " tensor must be on cuda:" << want.device_id
      << " (the kernel reads it on the device), got "
      << (d.device_type == kDLCUDA ? "cuda:" + std::to_string(d.device_id) : std::string("CPU"));
}

// ---- workspace ---------------------------------------------------------------------------------

constexpr size_t kWsAlign = 256;

int64_t buffer_bytes(const TensorView& t) { return t.numel() * ((t.dtype().bits + 7) / 8); }
size_t align_up(size_t x) { return (x + kWsAlign - 1) / kWsAlign * kWsAlign; }

// The narrow kernels' units are the smallest (16 rows); the workspace is sized for them, so that
// its size does not depend on which kernel a call takes.
constexpr int kMinUnitRows = 16;

// The longest KV a request may have, in tokens: the kernels count a request's tokens in int32 up
// to its length rounded up to a block, with room to spare.
constexpr int64_t kMaxKvTokens = (int64_t{1} << 31) - (int64_t{1} << 16);

int64_t max_units_of(int64_t batch, int64_t total_q, int64_t num_heads) {
  // sum_b ceil(n_b H / u) <= total_q H / u + B for units of u >= 16 rows, whatever the split of
  // total_q into requests.
  return total_q * num_heads / kMinUnitRows + batch;
}

// CTAs of the attention kernel: at most one per SM (1 CTA/SM: 225 KiB of smem).
int64_t max_ctas_of(int64_t sm_count) { return std::min<int64_t>(std::max<int64_t>(sm_count, 1), kMaxCtas); }

// The CTAs in sets of m_group, which run the m_group units of a group side by side over the same
// KV blocks, so that each block comes from DRAM once and L2 serves the other readers. Units of
// one request read the same blocks (a later token's rows one more, clipped per unit): m_group
// divides the units every request has (at most 4). shared_rows: the rows every request has a
// multiple of, q_len * H for a uniform query, H (one token's heads) for a ragged one. 64-row
// units: H 128 gives 2 per token, H 128 with q_len 2 or 4 gives 4 (each block then comes from
// DRAM once for the request, not once per token: 7% faster at B128 kv4096 H128 q2, Session 25);
// narrow (16 / 32-row) units: H = 128 gives 4 of 32 rows.
struct CtaPlan {
  int m_group;
  int num_ctas;
};
CtaPlan cta_plan(int64_t shared_rows, int unit_rows, int64_t sm_count) {
  int m_group = 1;
  while (m_group < 4 && shared_rows % (2 * m_group * unit_rows) == 0) m_group *= 2;
  const int64_t ctas = max_ctas_of(sm_count);
  if (m_group > ctas) m_group = 1;  // a tiny sm_count: never more CTAs than it allows
  return CtaPlan{m_group, static_cast<int>(ctas / m_group * m_group)};
}

// Byte offsets of the workspace's parts, sized for at most max_ctas_of(sm_count) CTAs (whatever
// their sets) and units of >= kMinUnitRows rows. The plan's header comes first, at the same
// offset whatever the call (plan_cache.cuh: a call reads it before it knows whether the last one
// had its layout); the plan words read after the plan (group_prefix, bounds, split_groups, with
// their padding) lie in one span, and their shadows in a span of the same size after it.
struct WorkspaceLayout {
  size_t plan_header, plan_input_copy, cost_prefix, group_prefix, bounds, split_groups, plan_shadow;
  size_t partial_lse, partial_o, total;
  int64_t ctas;  // the CTAs it is sized for
};

WorkspaceLayout workspace_layout(int64_t batch, int64_t total_q, int64_t num_heads, int64_t sm_count) {
  const int64_t units = max_units_of(batch, total_q, num_heads);
  WorkspaceLayout w{};
  const int64_t ctas = max_ctas_of(sm_count);
  const int64_t slots = kSlotsPerCta * ctas;
  w.ctas = ctas;
  size_t off = 0;
  w.plan_header = off;     off = align_up(off + sizeof(int) * kPlanKeyWords);
  w.plan_input_copy = off; off = align_up(off + sizeof(int) * (2 * batch + 1));
  w.cost_prefix = off;     off = align_up(off + sizeof(int64_t) * (units + 1));
  w.group_prefix = off;    off = align_up(off + sizeof(int) * (batch + 1));
  w.bounds = off;          off = align_up(off + sizeof(WorkPos) * (ctas + 1));
  w.split_groups = off;    off = align_up(off + sizeof(int) * (2 * ctas + 1));
  w.plan_shadow = off;     off += off - w.group_prefix;
  w.partial_lse = off;     off = align_up(off + sizeof(float) * slots * kBlockM);
  w.partial_o = off;    off = align_up(off + sizeof(float) * slots * kBlockM * kHeadDimV);
  w.total = off + kWsAlign;  // slack: the buffer's start is aligned up to 256 bytes
  return w;
}

// Whether the last call launched on this workspace had this plan key (then the kernel checks for
// its plan there, plan_cache.cuh; otherwise it plans without the check's round trip, as after a
// call of another shape on a shared workspace). A hint only: either answer gives the same result.
// Under CUDA-graph capture the answers follow the captured order, which replays keep.
using PlanKey = std::array<int, kPlanKeyWords>;
bool plan_key_seen(const void* ws_base, const PlanKey& key) {
  static std::mutex mutex;
  static std::vector<std::pair<const void*, PlanKey>> last;  // a few workspaces
  std::lock_guard<std::mutex> lock(mutex);
  for (auto& [base, seen] : last) {
    if (base != ws_base) continue;
    const bool same = seen == key;
    seen = key;
    return same;
  }
  if (last.size() >= 64) last.erase(last.begin());  // bounded: the oldest workspace forgotten
  last.emplace_back(ws_base, key);
  return false;
}

int64_t workspace_size(int64_t batch, int64_t total_q, int64_t num_heads, int64_t sm_count) {
  MLA_CHECK(batch >= 0 && total_q >= 0 && num_heads >= 1 && sm_count >= 1, ValueError)
      << "workspace_size needs batch >= 0, total_q >= 0, num_heads >= 1, sm_count >= 1, got "
      << batch << ", " << total_q << ", " << num_heads << ", " << sm_count;
  return static_cast<int64_t>(workspace_layout(batch, total_q, num_heads, sm_count).total);
}

// ---- kernels from the verified cubin -----------------------------------------------------------
// The attention kernels of a cubin: one table of names and shared-memory sizes, used to look them
// up, to raise their limits and to launch them.
// kSeesaw: TMA + seesaw (page sizes 8..64 dividing 64, or multiples of 64); kAnyPage: cp.async
// loads, any page size (1 included). Both merge their splits themselves (common/combine.cuh): one
// launch per call. kNarrow16: TMA pages, bf16, transposed tiles for units of 16 rows. The
// kNarrow{16,32}Fp8 kernels read a float8_e4m3fn cache in units of 16 / 32 rows (kept fp8 in shared
// memory: QK^T and PV on e4m3 wgmmas), the _fp8_any ones load it by cp.async for the page sizes TMA
// does not fit; the _fp8q ones take an e4m3 query too (both matmuls on e4m3 wgmmas). The fp8
// narrow ids are laid out so that kNarrow16Fp8 (+ kNarrowFp8Rows32) (+ kNarrowFp8Any) (+ kNarrowFp8Q)
// picks one. (A bf16 32-row narrow kernel took 1-9% longer than the 64-row seesaw at 32 rows from B1
// to B128, Session 44: bf16 requests of 17-32 rows run there.) kWideFp8Q: e4m3 query and
// cache, TMA pages, 64-row units (requests of more than 32 rows); kWideFp8: the same with a bf16
// query (Q and P as hi + lo e4m3 rows). kSeesawReread: kSeesaw with the KV at L2's normal
// priority, for a request with more rows than the grid holds at once (rows_hint > CTAs x 64).
// kSeesawShort: kSeesaw without its steady pair body, for calls with few KV blocks per CTA.
enum KernelId : int {
  kSeesaw, kAnyPage,
  kNarrow16, kNarrow16Fp8, kNarrow32Fp8, kNarrow16Fp8Any, kNarrow32Fp8Any,
  kNarrow16Fp8Q, kNarrow32Fp8Q, kNarrow16Fp8QAny, kNarrow32Fp8QAny,
  kWideFp8Q, kWideFp8, kSeesawReread, kSeesawShort,
  kNumKernels,
};
// kSeesawShort's bound, KV blocks per CTA: the general-body-only seesaw ran B8 kv4096 H128 (~8
// blocks per CTA) 4.5% faster, B1 kv65536 H128 (~16) 0.5% faster, B32 kv4096 H128 (~31) 0.5%
// slower, B128 kv4096 H128 5% slower (same-run A/B, Session 22).
constexpr int kShortBlocksPerCta = 16;
constexpr int kNarrowFp8Rows32 = kNarrow32Fp8 - kNarrow16Fp8, kNarrowFp8Any = kNarrow16Fp8Any - kNarrow16Fp8,
              kNarrowFp8Q = kNarrow16Fp8Q - kNarrow16Fp8;
static_assert(kNarrow32Fp8QAny == kNarrow16Fp8 + kNarrowFp8Rows32 + kNarrowFp8Any + kNarrowFp8Q,
              "the fp8 narrow ids must add up as laid out");
struct KernelInfo {
  const char* name;
  int smem;  // dynamic shared memory bytes
};
const KernelInfo kKernelInfo[kNumKernels] = {
    {"mla_sm90_attention", sm90::kSeesawSmemBytes},
    {"mla_sm90_attention_any_page", sm90::kAttentionSmemBytes},
    {"mla_sm90_attention_narrow16", sm90::narrow_smem_bytes<16>()},
    {"mla_sm90_attention_narrow16_fp8", sm90::narrow_fp8_smem_bytes<16>()},
    {"mla_sm90_attention_narrow32_fp8", sm90::narrow_fp8_smem_bytes<32>()},
    {"mla_sm90_attention_narrow16_fp8_any", sm90::narrow_fp8_smem_bytes<16>()},
    {"mla_sm90_attention_narrow32_fp8_any", sm90::narrow_fp8_smem_bytes<32>()},
    {"mla_sm90_attention_narrow16_fp8q", sm90::narrow_fp8_smem_bytes<16>()},
    {"mla_sm90_attention_narrow32_fp8q", sm90::narrow_fp8_smem_bytes<32>()},
    {"mla_sm90_attention_narrow16_fp8q_any", sm90::narrow_fp8_smem_bytes<16>()},
    {"mla_sm90_attention_narrow32_fp8q_any", sm90::narrow_fp8_smem_bytes<32>()},
    {"mla_sm90_attention_wide_fp8q", sm90::kWideFp8SmemBytes},
    {"mla_sm90_attention_wide_fp8", sm90::kWideFp8BSmemBytes},
    {"mla_sm90_attention_reread", sm90::kSeesawSmemBytes},
    {"mla_sm90_attention_short", sm90::kSeesawSmemBytes},
};

struct Kernels {
  std::string arch;
  cudaLibrary_t library = nullptr;
  cudaKernel_t fn[kNumKernels] = {};
  std::vector<bool> ready;  // per device: arch checked, shared-memory limits raised
  // Per device, bit id: the kernel that takes all of sm_90's shared memory as dynamic shared
  // memory could not get it (its cubin has static shared memory: a JIT_MLA_PROBE build's records).
  // Refused at its launch, so that the other kernels stay usable in such a build.
  std::vector<uint32_t> unfit;
};
std::mutex g_mutex;
Kernels g_kernels;

#define MLA_CUDA_CHECK(expr, what)                                                      \
  do {                                                                                  \
    cudaError_t err_ = (expr);                                                          \
    MLA_CHECK(err_ == cudaSuccess, RuntimeError)                                        \
        << what << " failed: " << cudaGetErrorName(err_) << " (" << cudaGetErrorString(err_) << ")"; \
  } while (0)

// data: the cubin's bytes, already checked against cubins/manifest.json by the Python loader.
void load_cubin(String arch, Bytes data) {
  std::lock_guard<std::mutex> lock(g_mutex);
  MLA_CHECK(std::string(arch) == "sm_90a", ValueError)
      << "load_cubin: no kernels for arch " << std::string(arch) << " (supported: sm_90a)";
  cudaLibrary_t lib = nullptr;
  MLA_CUDA_CHECK(cudaLibraryLoadData(&lib, data.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
                 "cudaLibraryLoadData(" + std::string(arch) + " cubin)");
  Kernels k;
  k.arch = std::string(arch);
  k.library = lib;
  for (int id = 0; id < kNumKernels; ++id)
    MLA_CUDA_CHECK(cudaLibraryGetKernel(&k.fn[id], lib, kKernelInfo[id].name),
                   std::string("cudaLibraryGetKernel(") + kKernelInfo[id].name + ")");
  if (g_kernels.library != nullptr) cudaLibraryUnload(g_kernels.library);
  g_kernels = k;
}

bool cubin_loaded() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_kernels.library != nullptr;
}

// Probe builds only (csrc/common/probe.h, JIT_MLA_PROBE bits 3-6): runs the cubin's
// mla_probe_dump (one thread) on the legacy stream and waits for it, so that the device printf
// of the records the last attention launch left in global memory is flushed when this returns
// (benchmarks/trace_phases.py reads it). A shipped cubin has no such kernel: RuntimeError.
void probe_dump() {
  cudaLibrary_t lib = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    lib = g_kernels.library;
  }
  MLA_CHECK(lib != nullptr, RuntimeError) << "probe_dump: no cubin loaded (call the attention first)";
  cudaKernel_t kernel = nullptr;
  const cudaError_t err = cudaLibraryGetKernel(&kernel, lib, "mla_probe_dump");
  if (err != cudaSuccess) (void)cudaGetLastError();  // not sticky: clear it
  MLA_CHECK(err == cudaSuccess, RuntimeError)
      << "probe_dump: the loaded cubin has no mla_probe_dump kernel: it is not a probe build "
         "(csrc/common/probe.h: JIT_MLA_PROBE with bit 3, 4, 5 or 6)";
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(1);
  cfg.blockDim = dim3(1);
  MLA_CUDA_CHECK(cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(kernel), nullptr), "launching mla_probe_dump");
  MLA_CUDA_CHECK(cudaDeviceSynchronize(), "mla_probe_dump");
}

// The device's SM count, asked of the driver once per device (every call needs it).
int64_t device_sm_count(int device) {
  static std::mutex mutex;
  static std::vector<int> counts;
  std::lock_guard<std::mutex> lock(mutex);
  if ((int)counts.size() <= device) counts.resize(device + 1, 0);
  if (counts[device] == 0) {
    int n = 0;
    MLA_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device),
                   "cudaDeviceGetAttribute(MultiProcessorCount)");
    counts[device] = n;
  }
  return counts[device];
}

// Arch and the kernels' shared-memory limits, set up once per device.
// unfit: the kernels (bit id) that could not get their shared memory on this device (Kernels::unfit),
// copied under the lock.
const Kernels& kernels_for_device(int device, uint32_t* unfit) {
  std::lock_guard<std::mutex> lock(g_mutex);
  MLA_CHECK(g_kernels.library != nullptr, RuntimeError)
      << "no kernels loaded: the launcher must be loaded through jit_mla.launcher.get_launcher(), "
         "which loads the verified cubin";
  if ((int)g_kernels.ready.size() <= device) {
    g_kernels.ready.resize(device + 1, false);
    g_kernels.unfit.resize(device + 1, 0u);
  }
  if (!g_kernels.ready[device]) {
    int major = 0, minor = 0;
    MLA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
                   "cudaDeviceGetAttribute");
    MLA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
                   "cudaDeviceGetAttribute");
    MLA_CHECK(major == 9 && minor == 0, RuntimeError)
        << "jit_mla's kernels need an sm_90a GPU (Hopper, compute capability 9.0); cuda:" << device
        << " is sm_" << major << minor;
    static_assert(kNumKernels <= 32, "one bit per kernel in Kernels::unfit");
    for (int id = 0; id < kNumKernels; ++id) {
      const cudaError_t err = cudaKernelSetAttributeForDevice(
          g_kernels.fn[id], cudaFuncAttributeMaxDynamicSharedMemorySize, kKernelInfo[id].smem, device);
      if (err != cudaSuccess && kKernelInfo[id].smem == sm90::kSmemOptin) {
        // Not sticky: cleared (with any earlier non-sticky error still pending), reported at this
        // kernel's launch.
        (void)cudaGetLastError();
        g_kernels.unfit[device] |= 1u << id;
        continue;
      }
      MLA_CUDA_CHECK(err, "raising an attention kernel's shared-memory limit to " +
                              std::to_string(kKernelInfo[id].smem) + " bytes");
    }
    g_kernels.ready[device] = true;
  }
  *unfit = g_kernels.unfit[device];
  return g_kernels;
}

// Cooperative: the kernel's CTAs wait for each other before the combine phase, which is only
// safe when all of them are resident at once (the driver refuses a grid that cannot be).
void launch(cudaKernel_t kernel, int grid, int block, int smem, cudaStream_t stream, bool pdl,
            MlaParams* params, const char* name) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 2 : 1;
  void* args[] = {params};
  const cudaError_t err = cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(kernel), args);
  MLA_CHECK(err == cudaSuccess, RuntimeError)
      << "launching " << name << " (" << grid << " CTAs, cooperative) failed: " << cudaGetErrorName(err)
      << " (" << cudaGetErrorString(err) << ")"
      << (err == cudaErrorCooperativeLaunchTooLarge
              ? "; it runs one CTA per SM: pass sm_count = the SMs this stream may use"
              : "");
}

// ---- TMA descriptor of the KV cache -------------------------------------------------------------
// The TMA kernel loads 64-token blocks as boxes of (64 columns, min(page, 64) rows) of one page.
// A box must start on a 1024-byte (8-row) boundary of the 128B swizzle and a block must not
// straddle pages unevenly: page sizes 8, 16, 32, 64 or multiples of 64.
bool tma_page_size(int64_t page_size) {
  return page_size % 64 == 0 || (page_size >= 8 && 64 % page_size == 0);
}

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's encoder, through the runtime (no link against libcuda).
EncodeTiledFn encode_tiled() {
  static EncodeTiledFn fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found{};
    MLA_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000,
                                                    cudaEnableDefault, &found),
                   "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)");
    MLA_CHECK(found == cudaDriverEntryPointSuccess && ptr != nullptr, RuntimeError)
        << "the CUDA driver has no cuTensorMapEncodeTiled (needs CUDA 12.0+)";
    return reinterpret_cast<EncodeTiledFn>(ptr);
  }();
  return fn;
}

// Encoding costs about a microsecond of host time; a layer's cache is the same tensor every
// step, so remember the last few (one per layer of a 61-layer model, plus room).
struct TmapEntry {
  const void* ptr;
  int64_t pages, page_size, row_stride, page_stride;
  bool fp8;
  CUtensorMap map;
};
std::mutex g_tmap_mutex;
std::vector<TmapEntry> g_tmaps;
constexpr size_t kMaxTmaps = 128;

// bf16: boxes of (rows, 64) land 128-byte swizzled, as the wgmma reads them. fp8 (e4m3 as bytes):
// boxes of (rows, 64) bytes land 64-byte swizzled, rows 64 bytes apart, as the fp8 kernel's
// wgmmas (K) and loads (V) read them.
CUtensorMap kv_tensor_map(const void* ptr, int64_t pages, int64_t page_size, int64_t row_stride,
                          int64_t page_stride, bool fp8) {
  std::lock_guard<std::mutex> lock(g_tmap_mutex);
  for (const TmapEntry& e : g_tmaps)
    if (e.ptr == ptr && e.pages == pages && e.page_size == page_size && e.row_stride == row_stride &&
        e.page_stride == page_stride && e.fp8 == fp8)
      return e.map;
  TmapEntry e{ptr, pages, page_size, row_stride, page_stride, fp8, {}};
  const cuuint64_t elem_bytes = fp8 ? 1 : 2;
  const cuuint64_t dims[3] = {kHeadDimQK, static_cast<cuuint64_t>(page_size), static_cast<cuuint64_t>(pages)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(row_stride) * elem_bytes,
                                 static_cast<cuuint64_t>(page_stride) * elem_bytes};
  const cuuint32_t box[3] = {kBoxCols, static_cast<cuuint32_t>(std::min<int64_t>(page_size, kBlockN)), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  // L2 promotion: none for bf16, whose box rows are whole 128-byte lines of a 1152-byte row. With
  // 256-byte promotion its kernels asked L2 for ~22% more read sectors than the KV holds (ncu, B64
  // kv8192 H16: 23.2 M, 4.2 M of them hits; FlashInfer's cp.async kernel 19.0 M), presumably the
  // promoted halves, and the H16 rows ran 2-5% slower (Session 23 A/B: B64 kv8192 H16 164.5 ->
  // 159.9 us, B128 kv4096 H16 q2 162.9 -> 154.1; H128 rows unchanged). fp8 box rows are 64 bytes:
  // there 256-byte promotion is the faster one (B64 kv8192 H16 fp8 2% slower without).
  const CUresult r = encode_tiled()(&e.map, fp8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                                    3, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE,
                                    fp8 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
                                    fp8 ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B : CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MLA_CHECK(r == CUDA_SUCCESS, RuntimeError)
      << "cuTensorMapEncodeTiled for kv_cache failed (CUresult " << int(r) << "): pages " << pages
      << ", page_size " << page_size << ", row stride " << row_stride << ", page stride " << page_stride;
  if (g_tmaps.size() >= kMaxTmaps) g_tmaps.erase(g_tmaps.begin());
  g_tmaps.push_back(e);
  return e.map;
}

// ---- the attention call, after the feature checks of the entry points -------------------------
// workspace_size_bytes: the size the caller claims (FlashInfer's argument), at most the buffer's.
void run_attention(TensorView out, Optional<TensorView> lse, TensorView query, TensorView key_cache,
                   TensorView workspace_buffer, int64_t workspace_size_bytes,
                   TensorView block_tables, TensorView seq_lens, Optional<TensorView> cum_seq_lens_q,
                   Optional<TensorView> attention_sinks, const Variant<double, Tensor>& bmm1_scale,
                   const Variant<double, Tensor>& bmm2_scale, int64_t max_q_len, int64_t batch_size,
                   int64_t sm_count, bool enable_pdl, int64_t max_kv_len) {
  // ---- 1a. dtypes ----------------------------------------------------------------------------
  // kv_cache: bf16, or fp8 e4m3 (its k/v scales folded into bmm1_scale / bmm2_scale by the
  // caller, the contract's convention; the kernels multiply K and V as e4m3 on fp8 tensor cores).
  // query: bf16, or fp8 e4m3 with an fp8 cache (its q scale folded into bmm1_scale; the narrow
  // fp8 kernels multiply it against K on fp8 tensor cores as it is).
  const bool kv_fp8 = same_dtype(key_cache.dtype(), kFP8E4M3);
  const bool q_fp8 = same_dtype(query.dtype(), kFP8E4M3);
  MLA_CHECK(!q_fp8 || kv_fp8, TypeError)
      << "query in float8_e4m3fn needs a float8_e4m3fn kv_cache, got kv_cache " << desc(key_cache);
  if (!q_fp8) check_dtype(query, kBF16, "query", "bfloat16 or float8_e4m3fn (with a float8_e4m3fn kv_cache)");
  if (!kv_fp8) check_dtype(key_cache, kBF16, "kv_cache", "bfloat16 or float8_e4m3fn");
  check_dtype(out, kBF16, "out", "bfloat16");
  check_dtype(block_tables, kI32, "block_tables", "int32");
  check_dtype(seq_lens, kI32, "seq_lens", "int32");
  if (cum_seq_lens_q.has_value()) check_dtype(*cum_seq_lens_q, kI32, "cum_seq_lens_q", "int32");
  if (attention_sinks.has_value()) check_dtype(*attention_sinks, kF32, "sinks", "float32");
  if (lse.has_value()) check_dtype(*lse, kF32, "lse", "float32");
  const Scale s1 = parse_scale(bmm1_scale, "bmm1_scale");
  const Scale s2 = parse_scale(bmm2_scale, "bmm2_scale");

  // ---- 1b. shapes and consistency --------------------------------------------------------------
  MLA_CHECK(batch_size >= 0, ValueError) << "batch_size must be >= 0, got " << batch_size;
  MLA_CHECK(block_tables.ndim() == 2, ValueError)
      << "block_tables must be int32 [batch_size, max_pages] = [" << batch_size << ", ...], got "
      << desc(block_tables);
  MLA_CHECK(block_tables.size(0) == batch_size, ValueError)
      << "block_tables must have batch_size = " << batch_size << " rows, got " << desc(block_tables);
  MLA_CHECK(block_tables.stride(1) == 1 || block_tables.size(1) <= 1, ValueError)
      << "block_tables rows must be contiguous (stride(1) == 1), got stride " << block_tables.stride(1);
  check_shape(seq_lens, {batch_size}, "seq_lens");
  check_contiguous(seq_lens, "seq_lens");

  MLA_CHECK(query.ndim() == 3 || query.ndim() == 4, ValueError)
      << "query must be [B, q_len, H, 576] or [total_q, H, 576], got " << desc(query);
  MLA_CHECK(query.size(-1) == kHeadDimQK, ValueError)
      << "query's last dim must be " << kHeadDimQK
      << " (kv_lora_rank 512 + qk_rope_head_dim 64), got " << desc(query);
  check_contiguous(query, "query");
  const int64_t num_heads = query.size(-2);
  MLA_CHECK(num_heads >= 1, ValueError) << "query must have at least one head, got " << desc(query);
  int64_t total_q = 0, q_len = 0;
  if (query.ndim() == 4) {
    MLA_CHECK(!cum_seq_lens_q.has_value(), ValueError)
        << "cum_seq_lens_q needs the ragged query layout [total_q, H, 576], got query "
        << desc(query);
    MLA_CHECK(query.size(0) == batch_size, ValueError)
        << "query [B, q_len, H, 576] must have B = batch_size = " << batch_size << ", got "
        << desc(query);
    q_len = query.size(1);
    total_q = batch_size * q_len;
  } else {
    total_q = query.size(0);
    if (cum_seq_lens_q.has_value()) {
      check_shape(*cum_seq_lens_q, {batch_size + 1}, "cum_seq_lens_q");
      check_contiguous(*cum_seq_lens_q, "cum_seq_lens_q");
      // No request to own them: the rows would be left unwritten.
      MLA_CHECK(batch_size > 0 || total_q == 0, ValueError)
          << "query has total_q = " << total_q << " rows but batch_size is 0, got query " << desc(query);
    } else {
      MLA_CHECK(batch_size > 0 ? total_q % batch_size == 0 : total_q == 0, ValueError)
          << "query [total_q, H, 576] without cum_seq_lens_q needs total_q divisible by batch_size = "
          << batch_size << ", got " << desc(query);
      q_len = batch_size > 0 ? total_q / batch_size : 0;
    }
  }
  MLA_CHECK(max_q_len >= 0, ValueError) << "max_q_len must be >= 0, got " << max_q_len;
  MLA_CHECK(total_q * num_heads < (int64_t(1) << 31), ValueError)
      << "query has total_q * H = " << total_q * num_heads << " rows; at most 2^31 - 1 are supported";
  // The kernels count requests and units in int32 (with room for the CTA count).
  const int64_t max_units = max_units_of(batch_size, total_q, num_heads);
  MLA_CHECK(max_units < (int64_t(1) << 31) - kMaxCtas, ValueError)
      << "batch_size = " << batch_size << " with " << total_q << " query rows of " << num_heads
      << " heads is too large: at most 2^31 - " << kMaxCtas << " work units are supported";
  // The plan's input copy and its span are counted in int32 (plan_cache.cuh: 2B + 1 copy words,
  // the span's int4s).
  MLA_CHECK(batch_size < (int64_t(1) << 30), ValueError)
      << "batch_size must be below 2^30, got " << batch_size;

  std::vector<int64_t> out_shape = shape_of(query);
  out_shape.back() = kHeadDimV;
  check_shape(out, out_shape, "out");
  check_contiguous(out, "out");
  if (lse.has_value()) {
    std::vector<int64_t> lse_shape = shape_of(query);
    lse_shape.pop_back();
    check_shape(*lse, lse_shape, "lse");
    check_contiguous(*lse, "lse");
  }
  if (attention_sinks.has_value()) {
    check_shape(*attention_sinks, {num_heads}, "sinks");
    check_contiguous(*attention_sinks, "sinks");
  }

  // kv_cache: [num_pages, page_size, 576] or [num_pages, 1, page_size, 576], maybe a strided view.
  MLA_CHECK(key_cache.ndim() == 3 || (key_cache.ndim() == 4 && key_cache.size(1) == 1), ValueError)
      << "kv_cache must be [num_pages, page_size, 576] or [num_pages, 1, page_size, 576], got "
      << desc(key_cache);
  MLA_CHECK(key_cache.size(-1) == kHeadDimQK, ValueError)
      << "kv_cache's last dim must be " << kHeadDimQK << ", got " << desc(key_cache);
  const int64_t page_size = key_cache.size(-2);
  const int64_t row_stride = key_cache.stride(-2), page_stride = key_cache.stride(0);
  MLA_CHECK(page_size >= 1, ValueError) << "kv_cache page_size must be >= 1, got " << desc(key_cache);
  MLA_CHECK(key_cache.stride(-1) == 1, ValueError)
      << "kv_cache's last dim must be contiguous (stride 1), got stride " << key_cache.stride(-1);
  // A request's KV length is clamped to the block table's width in tokens; past kMaxKvTokens the
  // kernels' int32 token counts (and their multiply-shift divisions, exact below 2^31) would overflow.
  MLA_CHECK(block_tables.size(1) <= kMaxKvTokens / page_size, ValueError)
      << "block_tables.size(1) * page_size must be <= " << kMaxKvTokens
      << " tokens (a request's KV length), got " << block_tables.size(1) << " * " << page_size;
  const int64_t align_elems = kv_fp8 ? 16 : 8;  // elements in 16 bytes
  MLA_CHECK(row_stride % align_elems == 0 && page_stride % align_elems == 0 && row_stride >= kHeadDimQK,
            ValueError)
      << "kv_cache rows must start 16-byte aligned: row stride and page stride must be multiples "
         "of " << align_elems << " elements (row stride >= 576), got row stride "
      << row_stride << ", page stride " << page_stride;
  // The kernel family. rows_hint: a request's rows, q_len * H, or max_q_len * H for a ragged
  // query (0: max_q_len not given). Only the choice depends on it: the device cuts every request
  // into units of the chosen kernel's rows, so a wrong max_q_len costs speed, never correctness.
  // - bf16: the narrow kernel (transposed tiles, units of 16 rows, tensor work not padded to 64
  //   rows) when a request has at most 16 rows and TMA fits the pages; else the 64-row kernels
  //   (TMA or cp.async). At 17-32 rows the 64-row seesaw streams faster than a 32-row narrow
  //   kernel did (Session 44: B1-B128 H16 MTP 2, 1-9% less time).
  // - fp8 cache, TMA pages, more than 32 rows (H 64 / 128, MTP, ragged): the wide fp8 kernels
  //   (64-row units, transposed tiles; e4m3 or bf16 query).
  // - fp8 otherwise: the narrow kernels (cp.async where TMA does not fit); a request of more than
  //   32 rows with other page sizes as several 32-row units side by side.
  // (max_q_len is clamped to total_q, which no request exceeds, so the product stays below 2^31.)
  const int64_t rows_hint =
      (cum_seq_lens_q.has_value() ? std::min<int64_t>(max_q_len, total_q) : q_len) * num_heads;
  const bool use_tma = tma_page_size(page_size);
  const bool wide_fp8 = kv_fp8 && use_tma && rows_hint > 32;
  const bool narrow = !wide_fp8 && (kv_fp8 || (use_tma && rows_hint >= 1 && rows_hint <= 16));
  // 64, 16, 32 rows (32 only with an fp8 cache: a bf16 narrow call has at most 16)
  const int unit_rows_log2 = !narrow ? 6 : rows_hint >= 1 && rows_hint <= 16 ? 4 : 5;
  // The kernels load kv_cache and query rows in 16-byte pieces and the split merge stores out in
  // 16-byte ones (8 bf16 per lane): a view that starts off those boundaries would fault
  // (misaligned address, a sticky error).
  check_aligned(key_cache, 16, "kv_cache");
  check_aligned(query, 16, "query");
  check_aligned(out, 16, "out");

  // workspace: bytes of scratch; the plan and the split partials live there.
  const int64_t ws_bytes = buffer_bytes(workspace_buffer);
  check_contiguous(workspace_buffer, "workspace_buffer");
  MLA_CHECK(workspace_size_bytes <= ws_bytes, ValueError)
      << "workspace_size = " << workspace_size_bytes << " bytes exceeds workspace_buffer's "
      << ws_bytes << " bytes";

  // ---- 1c. devices ------------------------------------------------------------------------------
  const DLDevice dev = query.device();
  check_device(query, dev, "query");
  check_device(key_cache, dev, "kv_cache");
  check_device(out, dev, "out");
  check_device(workspace_buffer, dev, "workspace_buffer");
  check_device(block_tables, dev, "block_tables");
  check_device(seq_lens, dev, "seq_lens");
  if (cum_seq_lens_q.has_value()) check_device(*cum_seq_lens_q, dev, "cum_seq_lens_q");
  if (attention_sinks.has_value()) check_device(*attention_sinks, dev, "sinks");
  if (lse.has_value()) check_device(*lse, dev, "lse");
  check_scale_device(s1, dev, "bmm1_scale");
  check_scale_device(s2, dev, "bmm2_scale");

  const bool sm_count_given = sm_count > 0;
  if (!sm_count_given) sm_count = device_sm_count(dev.device_id);
  WorkspaceLayout ws = workspace_layout(batch_size, total_q, num_heads, sm_count);
  MLA_CHECK(static_cast<int64_t>(ws.total) <= workspace_size_bytes, ValueError)
      << "workspace_buffer is too small: this call needs " << ws.total << " bytes (batch_size="
      << batch_size << ", total_q=" << total_q << ", H=" << num_heads << ", sm_count=" << sm_count
      << "), got workspace_size = " << workspace_size_bytes
      << "; jit_mla.get_workspace_size(...) gives the size";

  // ---- 1d. arch (and kernels) -----------------------------------------------------------------
  uint32_t unfit = 0;
  const Kernels& k = kernels_for_device(dev.device_id, &unfit);
  if (batch_size == 0 || total_q == 0) return;  // nothing to compute, nothing to write
  const int64_t device_sms = sm_count_given ? device_sm_count(dev.device_id) : sm_count;
  // One CTA per SM, all resident at once (cooperative launch): never more CTAs than the device
  // has SMs. The workspace was checked for the caller's sm_count; fewer CTAs need less of it.
  if (sm_count > device_sms) ws = workspace_layout(batch_size, total_q, num_heads, device_sms);
  const int64_t shared_rows = cum_seq_lens_q.has_value() ? num_heads : q_len * num_heads;
  const CtaPlan ctas = cta_plan(shared_rows, 1 << unit_rows_log2, std::min(sm_count, device_sms));

  // ---- 2. device guard and stream ---------------------------------------------------------------
  tvm::ffi::CUDADeviceGuard guard(dev.device_id);
  cudaStream_t stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, dev.device_id));

  // ---- 3. parameters --------------------------------------------------------------------------
  char* ws_base = reinterpret_cast<char*>(align_up(reinterpret_cast<uintptr_t>(data_of(workspace_buffer))));
  MlaParams p{};
  p.q = data_of(query);
  p.kv = data_of(key_cache);
  p.kv_page_stride = page_stride;
  p.kv_row_stride = row_stride;
  p.block_tables = reinterpret_cast<const int*>(data_of(block_tables));
  p.block_table_stride = block_tables.stride(0);
  p.seq_lens = reinterpret_cast<const int*>(data_of(seq_lens));
  p.cum_q = cum_seq_lens_q.has_value() ? reinterpret_cast<const int*>(data_of(*cum_seq_lens_q)) : nullptr;
  p.q_len = static_cast<int>(q_len);
  p.total_q = static_cast<int>(total_q);
  p.kv_cap = static_cast<int>(block_tables.size(1) * page_size);  // <= kMaxKvTokens (checked above)
  p.batch = static_cast<int>(batch_size);
  p.page_div = make_fast_div(page_size);
  p.head_div = make_fast_div(num_heads);
  p.sinks = attention_sinks.has_value() ? reinterpret_cast<const float*>(data_of(*attention_sinks)) : nullptr;
  p.bmm1_scale_ptr = s1.ptr;
  p.bmm2_scale_ptr = s2.ptr;
  p.bmm1_scale = s1.value;
  p.bmm2_scale = s2.value;
  p.out = data_of(out);
  p.lse = lse.has_value() ? reinterpret_cast<float*>(data_of(*lse)) : nullptr;
  p.plan_header = reinterpret_cast<int*>(ws_base + ws.plan_header);
  p.plan_input_copy = reinterpret_cast<int*>(ws_base + ws.plan_input_copy);
  p.plan_span4 = static_cast<int>((ws.plan_shadow - ws.group_prefix) / sizeof(int4));
  p.group_prefix = reinterpret_cast<int*>(ws_base + ws.group_prefix);
  p.cost_prefix = reinterpret_cast<int64_t*>(ws_base + ws.cost_prefix);
  p.bounds = reinterpret_cast<WorkPos*>(ws_base + ws.bounds);
  p.split_groups = reinterpret_cast<int*>(ws_base + ws.split_groups);
  p.partial_lse = reinterpret_cast<float*>(ws_base + ws.partial_lse);
  p.partial_o = reinterpret_cast<float*>(ws_base + ws.partial_o);
  p.max_groups = static_cast<int>(max_units);
  p.m_group = ctas.m_group;
  p.m_group_log2 = __builtin_ctz(static_cast<unsigned>(ctas.m_group));  // m_group: 1, 2 or 4
  p.num_ctas = ctas.num_ctas;
  p.unit_rows_log2 = unit_rows_log2;
  // The plan's key (plan_cache.cuh): all it depends on but the input values, and the layout of
  // the words it is kept in. Word 0 names the plan's format: change it with plan.cuh's rules.
  const PlanKey plan_key = {
      kPlanFormat, p.batch, p.cum_q != nullptr ? -1 : p.q_len, p.total_q, p.head_div.d, p.kv_cap,
      p.unit_rows_log2, p.m_group, p.num_ctas, p.max_groups, static_cast<int>(ws.ctas), 0};
  std::copy(plan_key.begin(), plan_key.end(), p.plan_key);
  p.plan_check = plan_key_seen(ws_base, plan_key) ? 1 : 0;
  p.num_pages = static_cast<int>(key_cache.size(0));
  p.kv_box_rows = static_cast<int>(std::min<int64_t>(page_size, kBlockN));
  if (use_tma) p.kv_tmap = kv_tensor_map(p.kv, key_cache.size(0), page_size, row_stride, page_stride, kv_fp8);

  // ---- 4. launch: one kernel (each CTA plans, attends, then merges splits), PDL when enabled ---
  // (narrow and unit_rows_log2: worked out with the kv_cache checks above.)
  // The seesaw's twins (TMA pages, bf16, more than 32 rows), worked out only when one is launched:
  // _reread for a request with more rows than the grid holds at once; _short for few KV blocks
  // per CTA (B8 kv4096 H128: ~8), the seesaw without its steady pair body. The blocks are
  // estimated from max_kv_len (max_seq_len, a hint: 0 or less when not given) capped by the block
  // table's width, and rows_hint (none when 0): a wrong hint costs speed only.
  const auto seesaw_kernel = [&]() -> int {
    if (rows_hint > (static_cast<int64_t>(p.num_ctas) << unit_rows_log2)) return kSeesawReread;
    const int64_t kv_hint = std::min<int64_t>(max_kv_len > 0 ? max_kv_len : INT64_MAX,
                                              static_cast<int64_t>(p.kv_cap));
    // In double: batch x units x blocks may pass int64 for absurd hints.
    const double est_blocks = static_cast<double>(batch_size) *
                              static_cast<double>((rows_hint + kBlockM - 1) / kBlockM) *
                              static_cast<double>((kv_hint + kBlockN - 1) / kBlockN);
    const bool few = rows_hint >= 1 && est_blocks <= static_cast<double>(kShortBlocksPerCta) * p.num_ctas;
    return few ? kSeesawShort : kSeesaw;
  };
  const int id = wide_fp8 ? (q_fp8 ? kWideFp8Q : kWideFp8)
                 : !narrow ? (use_tma ? seesaw_kernel() : kAnyPage)
                 : !kv_fp8 ? kNarrow16
                           : kNarrow16Fp8 + (unit_rows_log2 == 4 ? 0 : kNarrowFp8Rows32) +
                                 (use_tma ? 0 : kNarrowFp8Any) + (q_fp8 ? kNarrowFp8Q : 0);
  MLA_CHECK(!(unfit >> id & 1u), RuntimeError)
      << kKernelInfo[id].name << " needs all " << kKernelInfo[id].smem
      << " bytes of shared memory as dynamic shared memory, and raising its limit failed on this "
         "device (a JIT_MLA_PROBE build's static shared memory does that: probe the other kernels, "
         "or shrink the probe)";
  launch(k.fn[id], p.num_ctas, kNumThreads, kKernelInfo[id].smem, stream, enable_pdl, &p, kKernelInfo[id].name);
}

// ---- entry 1: FlashInfer's trtllm-gen launcher arguments, plus lse -------------------------------
void trtllm_paged_attention_decode(
    TensorView out, Optional<TensorView> out_scale_factor, TensorView query, TensorView key_cache,
    TensorView value_cache, TensorView workspace_buffer, TensorView block_tables,
    TensorView seq_lens, int64_t max_q_len, int64_t max_kv_len, Variant<double, Tensor> bmm1_scale,
    Variant<double, Tensor> bmm2_scale, double o_sf_scale, int64_t o_sf_vec_size,
    int64_t o_sf_start_index, int64_t batch_size, int64_t window_left, int64_t sparse_mla_top_k,
    int64_t sm_count, bool enable_pdl, int64_t workspace_size_bytes,
    Optional<TensorView> attention_sinks, Optional<TensorView> cum_seq_lens_q,
    Optional<TensorView> key_block_scales, Optional<TensorView> value_block_scales,
    Optional<float> skip_softmax_threshold_scale_factor, Optional<bool> uses_shared_paged_kv_idx,
    Optional<TensorView> lse) {
  (void)o_sf_scale;
  (void)o_sf_vec_size;
  (void)o_sf_start_index;

  // Features not supported yet: refuse, never ignore.
  MLA_CHECK(!out_scale_factor.has_value(), NotImplementedError)
      << "out_scale_factor (fp4 output) is not supported yet";
  MLA_CHECK(sparse_mla_top_k == 0, NotImplementedError)
      << "sparse_mla_top_k > 0 (sparse MLA) is not supported yet, got " << sparse_mla_top_k;
  MLA_CHECK(window_left < 0, NotImplementedError)
      << "window_left >= 0 (sliding window) is not supported, got " << window_left;
  MLA_CHECK(!key_block_scales.has_value() && !value_block_scales.has_value(), NotImplementedError)
      << "key_block_scales / value_block_scales (block-scaled KV) are not supported yet";
  MLA_CHECK(!skip_softmax_threshold_scale_factor.has_value(), NotImplementedError)
      << "skip_softmax_threshold_scale_factor is not supported yet";
  MLA_CHECK(!uses_shared_paged_kv_idx.has_value() || *uses_shared_paged_kv_idx, NotImplementedError)
      << "uses_shared_paged_kv_idx=False (separate K and V page indices) is not supported";
  // MLA's one-copy latent cache: the second cache argument is the first one again (only this
  // entry has it).
  MLA_CHECK(value_cache.data_ptr() == key_cache.data_ptr() &&
                value_cache.byte_offset() == key_cache.byte_offset() &&
                shape_of(value_cache) == shape_of(key_cache),
            ValueError)
      << "value_cache must be the same tensor as key_cache (MLA's one-copy latent cache), got "
      << desc(value_cache) << " vs " << desc(key_cache);
  run_attention(out, lse, query, key_cache, workspace_buffer, workspace_size_bytes,
                block_tables, seq_lens, cum_seq_lens_q, attention_sinks, bmm1_scale, bmm2_scale,
                max_q_len, batch_size, sm_count, enable_pdl, max_kv_len);
}

// ---- entry 2: what jit_mla's Python wrapper calls on every step ---------------------------------
// The same call with only the arguments that carry information (16 instead of 28: each argument
// costs TVM-FFI some 50 ns to convert), the batch size derived here when not given, the workspace
// size taken from the buffer itself. max_kv_len (the caller's max_seq_len) last: a hint for the
// kernel choice only.
void mla_decode(TensorView out, Optional<TensorView> lse, TensorView query, TensorView kv_cache,
                TensorView workspace_buffer, TensorView block_tables, TensorView seq_lens,
                Optional<TensorView> cum_seq_lens_q, Optional<TensorView> sinks,
                Variant<double, Tensor> bmm1_scale, Variant<double, Tensor> bmm2_scale,
                Optional<int64_t> max_q_len, Optional<int64_t> batch_size, int64_t sm_count,
                bool enable_pdl, int64_t max_kv_len) {
  const int64_t batch = batch_size.has_value() ? *batch_size
                        : block_tables.ndim() >= 1 ? block_tables.size(0) : 0;
  // max_q_len is only validated (>= 0): the kernels take each request's length from the device.
  const int64_t q_max = max_q_len.value_or(0);
  run_attention(out, lse, query, kv_cache, workspace_buffer, buffer_bytes(workspace_buffer), block_tables,
                seq_lens, cum_seq_lens_q, sinks, bmm1_scale, bmm2_scale, q_max, batch, sm_count,
                enable_pdl, max_kv_len);
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(trtllm_paged_attention_decode, trtllm_paged_attention_decode);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(mla_decode, mla_decode);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(workspace_size, workspace_size);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(load_cubin, load_cubin);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(cubin_loaded, cubin_loaded);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_dump, probe_dump);
