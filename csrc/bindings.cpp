// Every schema of the specdec namespace, in one place (DESIGN.md §4).
// Kernels register beside their families with TORCH_LIBRARY_IMPL (C++ CPU/CUDA)
// or torch.library.impl (the *_triton ops, launched from Python); fake impls live
// in specdec_ops/_fake.py.
#include <Python.h>
#include <torch/library.h>

// `import specdec_ops._C` loads this library (and so runs the registrations below)
// without pybind11.
extern "C" {
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", "specdec_ops native ops", -1, nullptr};
  return PyModule_Create(&module_def);
}
}

TORCH_LIBRARY(specdec, m) {
  // ---- chain rejection sampling (§5.2) -> (token_ids int64 [B, K+1], num_accepted int32 [B])
  // Engine keywords (issue #14), appended with defaults: bonus_token_ids int32/int64 [B] or [B, 1] (the target
  // may then omit its bonus rows: [B, K, V] / [T, V]), reject_invalid_drafts, synthetic_acceptance_rates float32 [R].
  m.def(
      "rejection_sample(Tensor target_probs, Tensor draft_token_ids, Tensor num_draft_tokens, "
      "Tensor? draft_probs, Tensor seeds, Tensor offsets, Tensor? greedy, "
      "Tensor? bonus_token_ids=None, bool reject_invalid_drafts=False, Tensor? synthetic_acceptance_rates=None) "
      "-> (Tensor, Tensor)");
  m.def(
      "rejection_sample_triton(Tensor target_probs, Tensor draft_token_ids, Tensor num_draft_tokens, "
      "Tensor? draft_probs, Tensor seeds, Tensor offsets, Tensor? greedy, "
      "Tensor? bonus_token_ids=None, bool reject_invalid_drafts=False, Tensor? synthetic_acceptance_rates=None) "
      "-> (Tensor, Tensor)");
  m.def(
      "rejection_sample_packed(Tensor target_probs, Tensor cu_num_draft_tokens, Tensor draft_token_ids, "
      "Tensor? draft_probs, Tensor seeds, Tensor offsets, Tensor? greedy, int max_num_draft_tokens, "
      "Tensor? bonus_token_ids=None, bool reject_invalid_drafts=False, Tensor? synthetic_acceptance_rates=None) "
      "-> (Tensor, Tensor)");
  m.def(
      "rejection_sample_packed_triton(Tensor target_probs, Tensor cu_num_draft_tokens, Tensor draft_token_ids, "
      "Tensor? draft_probs, Tensor seeds, Tensor offsets, Tensor? greedy, int max_num_draft_tokens, "
      "Tensor? bonus_token_ids=None, bool reject_invalid_drafts=False, Tensor? synthetic_acceptance_rates=None) "
      "-> (Tensor, Tensor)");

  // ---- tree verification (§5.3) -> (token_ids int64 [B, N], accepted_path int32 [B, N], num_accepted int32 [B])
  m.def(
      "tree_rejection_sample(Tensor target_probs, Tensor tree_token_ids, Tensor parents, Tensor? num_nodes, "
      "Tensor? draft_probs, Tensor seeds, Tensor offsets, Tensor? greedy) -> (Tensor, Tensor, Tensor)");
  m.def(
      "tree_rejection_sample_triton(Tensor target_probs, Tensor tree_token_ids, Tensor parents, Tensor? num_nodes, "
      "Tensor? draft_probs, Tensor seeds, Tensor offsets, Tensor? greedy) -> (Tensor, Tensor, Tensor)");

  // ---- tree metadata and tree attention (§5.4)
  // build_tree -> (mask int64 [B, N, ceil(N/64)], depth int32 [B, N])
  m.def("build_tree(Tensor parents, Tensor? num_nodes) -> (Tensor, Tensor)");
  // tree_attention -> (out [B, N, Hq, D], lse float32 [B, N, Hq])
  m.def(
      "tree_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor prefix_lens, Tensor mask, "
      "Tensor? block_table, float sm_scale) -> (Tensor, Tensor)");
  m.def(
      "tree_attention_triton(Tensor q, Tensor k_cache, Tensor v_cache, Tensor prefix_lens, Tensor mask, "
      "Tensor? block_table, float sm_scale) -> (Tensor, Tensor)");
  m.def("merge_attention_states(Tensor out_a, Tensor lse_a, Tensor out_b, Tensor lse_b) -> (Tensor, Tensor)");
  m.def(
      "merge_attention_states_triton(Tensor out_a, Tensor lse_a, Tensor out_b, Tensor lse_b) -> (Tensor, Tensor)");

  // ---- KV commit (§5.5): mutates every cache and seq_lens in place
  m.def(
      "kv_commit(Tensor(a!)[] caches, Tensor(b!) seq_lens, Tensor accepted_path, Tensor? block_table) -> ()");
  m.def(
      "kv_commit_triton(Tensor(a!)[] caches, Tensor(b!) seq_lens, Tensor accepted_path, Tensor? block_table) -> ()");
}

TORCH_LIBRARY_FRAGMENT(specdec, m) {
  // ---- verification from logits (§5.7). Sampling parameters: temperature float32 [B], top_k int64 [B],
  // top_p float32 [B], min_p float32 [B] (None: off / 1.0). logprobs: float32 [B, K+1] / [B, N], or an empty
  // [0] tensor when return_logprobs is false.
  // process_logits -> probs float32, the shape of logits
  m.def("process_logits(Tensor logits, Tensor? temperature, Tensor? top_k, Tensor? top_p, Tensor? min_p) -> Tensor");
  m.def(
      "process_logits_triton(Tensor logits, Tensor? temperature, Tensor? top_k, Tensor? top_p, Tensor? min_p) "
      "-> Tensor");
  // -> (token_ids int64 [B, K+1], num_accepted int32 [B], logprobs). Engine keywords (issue #14):
  // bonus_token_ids int [B] or [B, 1] (the bonus rows may then be absent: target [B, K, V] / [T, V]; the
  // logprob of an external bonus token is NaN), synthetic_acceptance_rates float32 [R >= K].
  m.def(
      "rejection_sample_logits(Tensor target_logits, Tensor draft_token_ids, Tensor num_draft_tokens, "
      "Tensor? draft_probs, Tensor? temperature, Tensor? top_k, Tensor? top_p, Tensor? min_p, Tensor seeds, "
      "Tensor offsets, bool return_logprobs, Tensor? bonus_token_ids=None, "
      "Tensor? synthetic_acceptance_rates=None) -> (Tensor, Tensor, Tensor)");
  m.def(
      "rejection_sample_logits_triton(Tensor target_logits, Tensor draft_token_ids, Tensor num_draft_tokens, "
      "Tensor? draft_probs, Tensor? temperature, Tensor? top_k, Tensor? top_p, Tensor? min_p, Tensor seeds, "
      "Tensor offsets, bool return_logprobs, Tensor? bonus_token_ids=None, "
      "Tensor? synthetic_acceptance_rates=None) -> (Tensor, Tensor, Tensor)");
  m.def(
      "rejection_sample_logits_packed(Tensor target_logits, Tensor cu_num_draft_tokens, Tensor draft_token_ids, "
      "Tensor? draft_probs, Tensor? temperature, Tensor? top_k, Tensor? top_p, Tensor? min_p, Tensor seeds, "
      "Tensor offsets, bool return_logprobs, int max_num_draft_tokens, Tensor? bonus_token_ids=None, "
      "Tensor? synthetic_acceptance_rates=None) -> (Tensor, Tensor, Tensor)");
  m.def(
      "rejection_sample_logits_packed_triton(Tensor target_logits, Tensor cu_num_draft_tokens, "
      "Tensor draft_token_ids, Tensor? draft_probs, Tensor? temperature, Tensor? top_k, Tensor? top_p, "
      "Tensor? min_p, Tensor seeds, Tensor offsets, bool return_logprobs, int max_num_draft_tokens, "
      "Tensor? bonus_token_ids=None, Tensor? synthetic_acceptance_rates=None) -> (Tensor, Tensor, Tensor)");
  // -> (token_ids int64 [B, N], accepted_path int32 [B, N], num_accepted int32 [B], logprobs)
  m.def(
      "tree_rejection_sample_logits(Tensor target_logits, Tensor tree_token_ids, Tensor parents, Tensor? num_nodes, "
      "Tensor? draft_probs, Tensor? temperature, Tensor? top_k, Tensor? top_p, Tensor? min_p, Tensor seeds, "
      "Tensor offsets, bool return_logprobs) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "tree_rejection_sample_logits_triton(Tensor target_logits, Tensor tree_token_ids, Tensor parents, "
      "Tensor? num_nodes, Tensor? draft_probs, Tensor? temperature, Tensor? top_k, Tensor? top_p, Tensor? min_p, "
      "Tensor seeds, Tensor offsets, bool return_logprobs) -> (Tensor, Tensor, Tensor, Tensor)");

  // ---- few-row linear products of a CPU verify forward (decoding/forward.py) -> out float32 [..., O]
  // x float32 [..., I], weight float32 [O, I], bias float32 [O]; isa -1 = the best this CPU has (CPU only).
  m.def("skinny_linear(Tensor x, Tensor weight, Tensor? bias=None, int isa=-1) -> Tensor");
  // the widest instruction set skinny_linear runs with here: 0 scalar, 1 AVX2, 2 AVX-512
  m.def("skinny_linear_isa() -> int");
}
