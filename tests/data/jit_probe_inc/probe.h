// Header for tests/data/jit_probe.cu. tests/test_jit.py edits PROBE_HEADER_VALUE in a copy of
// this file to check that a header change (under a hashed dir) changes the module key.
#pragma once
#include <cstdint>

#define PROBE_HEADER_VALUE 7
