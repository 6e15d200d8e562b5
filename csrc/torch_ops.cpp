// The torch glue of every kernel family (csrc/<family>/<family>_op.cpp: argument checks, CPU value
// checks, dispatch to the CPU or CUDA kernel, TORCH_LIBRARY_IMPL) compiled as one translation unit.
// Each glue file parses ATen's headers, which are most of its compile time: apart, the five took about
// 80 s of CPU with CUDA (15-20 s each), together 22 s (g++ -O3, torch 2.14). The build compiles this
// file and no *_op.cpp on its own (setup.py native_sources, CMakeLists.txt); each glue file still
// includes what it uses and keeps its helpers in its own namespace, so that it reads alone.
#include "kv/kv_op.cpp"
#include "linear/linear_op.cpp"
#include "logits/logits_op.cpp"
#include "rejection/rejection_op.cpp"
#include "tree/tree_op.cpp"
#include "tree_verify/tree_verify_op.cpp"
