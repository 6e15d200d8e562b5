// Raw-pointer description of one skinny_linear call (out = x @ weight^T + bias for a few rows of x), for
// the CPU kernel. No torch headers. The op is CPU-only: on a GPU a product over a few rows is cuBLAS's.
#pragma once

#include <cstdint>

namespace specdec {

struct SkinnyLinearParams {
  const float* x;        // [rows, in_features], row stride x_stride, unit stride along features
  int64_t x_stride;
  const float* weight;   // [out_features, in_features], row stride w_stride, unit stride along features
  int64_t w_stride;
  const float* bias;     // [out_features] (contiguous) or nullptr
  float* out;            // [rows, out_features], contiguous
  int64_t rows, in_features, out_features;
};

// The instruction set the kernel runs with: the widest this CPU has among the compiled ones.
enum class SkinnyIsa : int64_t { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// Implemented in linear_cpu.cpp. skinny_linear_cpu runs with `isa`, which must be at most
// skinny_linear_isa() (the op checks it; tests force each path).
SkinnyIsa skinny_linear_isa();
void skinny_linear_cpu(const SkinnyLinearParams& params, SkinnyIsa isa);

}  // namespace specdec
