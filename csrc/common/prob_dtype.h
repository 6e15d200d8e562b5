// Element type of probability rows as the kernels see it (no torch headers).
#pragma once

namespace specdec {

enum class ProbDType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

}  // namespace specdec
