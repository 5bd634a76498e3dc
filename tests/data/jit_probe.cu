// A tiny TVM-FFI module for tests/test_jit.py: host C++ only, so it builds and runs without a GPU.
// tests/test_jit.py copies this file (and jit_probe_inc/) into tmp_path before editing anything.
#include <tvm/ffi/function.h>

#include "probe.h"

namespace {

int64_t add_one(int64_t x) { return x + 1; }

// Returns a constant defined in probe.h, so a header edit is visible from Python.
int64_t header_value() { return PROBE_HEADER_VALUE; }

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(add_one, add_one);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(header_value, header_value);
