// Small device helpers shared by every arch: PTX wrappers whose semantics matter for ordering.
#pragma once
#include <cstdint>
#include <cuda_bf16.h>

namespace jit_mla {

__device__ __forceinline__ float exp2_approx(float x) {
  // ex2.approx: 2 ulp, flushes denormals; exp2(-inf) = 0, which the masked softmax relies on.
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float log2_approx(float x) {
  // lg2.approx: ~2^-22 absolute error on [0.5, 2]; its callers take sums >= 1 (one term is 2^0).
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float rcp_approx(float x) {
  // rcp.approx: 1 ulp, no IEEE division's slow path (its callers' x: a softmax sum >= 1, a count).
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// p itself, hidden from the compiler's address arithmetic: held in one 64-bit register, so that
// pointers formed from it take one wide multiply-add each rather than a rebuild from the kernel
// parameter it came from (the merge's loads: ~3 instructions per load otherwise).
template <typename T>
__device__ __forceinline__ const T* opaque_ptr(const T* p) {
  const T* q;
  asm("mov.b64 %0, %1;" : "=l"(q) : "l"(p));
  return q;
}

__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// 16-byte global->shared copy that zero-fills when !valid (src-size 0 reads nothing), so
// masked KV rows are 0, never the NaN or stale data that may sit there (0 * NaN = NaN in P V).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Shared memory written through the generic proxy (ordinary stores, cp.async) and read next by
// the async proxy (wgmma operands) needs this fence in the writing threads before the barrier.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Named barrier over `count` threads (id 0 is __syncthreads).
__device__ __forceinline__ void named_barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Programmatic dependent launch: wait until the preceding grid's memory is visible. A no-op when
// the kernel was launched without the PDL attribute.
__device__ __forceinline__ void pdl_wait_primary() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
// Let the next kernel in the stream start its launch (it still waits in pdl_wait_primary for our
// memory to be complete before it reads anything we write).
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ float load_scale(const float* ptr, float value) {
  // A device-tensor scale is read by the kernel itself: a replayed CUDA graph sees new values.
  return ptr != nullptr ? __ldg(ptr) : value;
}

}  // namespace jit_mla
