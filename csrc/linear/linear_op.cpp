// torch glue of specdec::skinny_linear (out = x @ weight^T + bias over a few rows of x, float32, CPU):
// argument checks (ValueError for shapes and devices, TypeError for dtypes; the Python wrapper re-raises
// both as SpecDecArgumentError) and the call of the CPU kernel. CPU only: there is no CUDA kernel (a GPU
// multiplies a few rows with cuBLAS at its memory bound), and the op has no CUDA registration.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../common/torch_checks.h"
#include "linear_params.h"

namespace specdec {
// This file's helpers (compiled with the other glue files in csrc/torch_ops.cpp).
namespace linear_op {

// x [..., I] and weight [O, I] float32, bias [O] float32 or None; isa: -1 the best this CPU has, else
// 0 (scalar), 1 (AVX2) or 2 (AVX-512), at most skinny_linear_isa() (skinny_linear_isa_op()).
at::Tensor skinny_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                         int64_t isa) {
  TORCH_CHECK_VALUE(x.dim() >= 1, "x must have at least 1 dimension [..., in_features], got shape ", x.sizes());
  check_rank(weight, 2, "weight", "[out_features, in_features]");
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat, "x must be float32, got ", x.scalar_type());
  TORCH_CHECK_TYPE(weight.scalar_type() == at::kFloat, "weight must be float32, got ", weight.scalar_type());
  check_same_device(weight, x, "weight", "x");
  TORCH_CHECK_VALUE(x.device().is_cpu(), "x must be on the CPU (skinny_linear has a CPU kernel only), got ",
                    x.device());
  const int64_t in = weight.size(1), out_features = weight.size(0);
  TORCH_CHECK_VALUE(x.size(-1) == in, "x must have shape [..., in_features = ", in, "] (weight is ",
                    weight.sizes(), "), got ", x.sizes());
  at::Tensor bias_c;
  if (bias) {
    check_rank(*bias, 1, "bias", "[out_features]");
    check_size(*bias, 0, out_features, "bias", "[out_features]");
    TORCH_CHECK_TYPE(bias->scalar_type() == at::kFloat, "bias must be float32, got ", bias->scalar_type());
    check_same_device(*bias, x, "bias", "x");
    bias_c = bias->contiguous();
  }
  const int64_t best = static_cast<int64_t>(skinny_linear_isa());
  TORCH_CHECK_VALUE(isa >= -1 && isa <= best, "isa must be -1 (the best this CPU has) or in [0, ", best,
                    "] (0 scalar, 1 AVX2, 2 AVX-512; this CPU has up to ", best, "), got ", isa);

  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out_features;
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < shape.size(); ++d) rows *= shape[d];
  auto out = at::empty(shape, x.options());
  if (rows == 0 || out_features == 0) return out;
  if (in == 0) {            // empty dot products: the bias alone
    return bias ? out.copy_(bias_c.expand_as(out)) : out.zero_();
  }
  const auto x2 = x.reshape({rows, in});
  const auto x_c = x2.stride(1) == 1 ? x2 : x2.contiguous();
  const auto w_c = weight.stride(1) == 1 ? weight : weight.contiguous();

  SkinnyLinearParams p;
  p.x = x_c.data_ptr<float>();
  p.x_stride = x_c.stride(0);
  p.weight = w_c.data_ptr<float>();
  p.w_stride = w_c.stride(0);
  p.bias = bias ? bias_c.data_ptr<float>() : nullptr;
  p.out = out.data_ptr<float>();
  p.rows = rows;
  p.in_features = in;
  p.out_features = out_features;
  skinny_linear_cpu(p, isa < 0 ? static_cast<SkinnyIsa>(best) : static_cast<SkinnyIsa>(isa));
  return out;
}

// The widest instruction set skinny_linear runs with on this CPU: 0 scalar, 1 AVX2, 2 AVX-512.
int64_t skinny_linear_isa_op() { return static_cast<int64_t>(skinny_linear_isa()); }

}  // namespace linear_op

TORCH_LIBRARY_IMPL(specdec, CPU, m) { m.impl("skinny_linear", &linear_op::skinny_linear); }
TORCH_LIBRARY_IMPL(specdec, CompositeImplicitAutograd, m) {
  m.impl("skinny_linear_isa", &linear_op::skinny_linear_isa_op);
}

}  // namespace specdec
