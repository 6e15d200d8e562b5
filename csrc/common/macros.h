// Portability macros shared by the CPU (g++) and CUDA (nvcc) translation units.
// No torch headers here: everything under csrc/common and the *_math.h headers
// compiles with a plain C++17 compiler and with nvcc alike.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SPECDEC_HD __host__ __device__ __forceinline__
#else
#define SPECDEC_HD inline
#endif
