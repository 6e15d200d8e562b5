"""Launch layout of the Triton tree attention kernel: the grid stays inside CUDA's limits at large batch x KV
heads, the split-KV partition follows each request's own prefix (not the cache capacity), and bfloat16 under
the interpreter (no bf16 arithmetic there) is refused with a clear error."""

import pytest
import torch

import specdec_ops
from specdec_ops import attention as attention_module
from specdec_ops._checks import BackendUnavailableError

from conftest import HAS_TRITON
from test_tree_attention import assert_matches_reference, make_case

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="needs triton")

MAX_X = 2**31 - 1  # CUDA grid limits: axis 0, axes 1 and 2
MAX_YZ = 65535


def test_grid_puts_batch_times_kv_heads_on_axis_0():
    for batch, hk, tiles, splits in [(2048, 32, 1, 1), (2048, 32, 2, 1), (4096, 64, 4, 1), (1, 8, 1, 32)]:
        grid = attention_module._launch_grid(batch, hk, tiles, splits)
        assert grid == (batch * hk, tiles, splits)
        assert grid[0] <= MAX_X and grid[1] <= MAX_YZ and grid[2] <= MAX_YZ


class _RecordingKernel:
    def __init__(self):
        self.grids = []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return lambda *args, **kwargs: None


def test_launch_with_2048_requests_and_32_kv_heads_stays_within_grid_limits(monkeypatch):
    from specdec_ops.triton_kernels import tree_attention as kernels

    recorder = _RecordingKernel()
    monkeypatch.setattr(kernels, "tree_attention_kernel", recorder)
    batch, hk, d = 2048, 32, 16
    q = torch.zeros(batch, 1, hk, d)
    cache = torch.zeros(batch, 2, hk, d)
    mask = torch.ones(batch, 1, 1, dtype=torch.int64)
    attention_module._launch_tree_attention(q, cache, cache, torch.zeros(batch, dtype=torch.int64), mask, None, 1.0)
    (grid,) = recorder.grids
    assert grid[0] == batch * hk and grid[0] <= MAX_X and grid[1] <= MAX_YZ and grid[2] <= MAX_YZ


def test_many_requests_and_kv_heads_match_reference():
    """Axis 0 decodes into (request, KV head): requests and heads that a swapped decode would mix up."""
    q, k, v, prefix_lens, mask = make_case(batch=3, n=3, hq=6, hk=3, d=16, prefix=(2, 9, 5), seed=7)
    assert_matches_reference("triton", q, k, v, prefix_lens, mask)


def test_splits_share_the_request_prefix_not_the_cache_capacity(monkeypatch):
    """4 splits over a 256-key prefix (4 tiles of 64) in a 1024-slot cache: every split gets a tile of the
    prefix (sized from the capacity, split 0 would take all of it and splits 1-2 nothing)."""
    from specdec_ops.triton_kernels import tree_attention as kernels

    monkeypatch.setattr(attention_module, "_FORCE_NUM_SPLITS", 4)
    partial_lse = []
    real_combine = kernels.combine_splits_kernel

    class Combine:
        def __getitem__(self, grid):
            def launch(part_out, part_lse, *args, **kwargs):
                partial_lse.append(part_lse.clone())
                return real_combine[grid](part_out, part_lse, *args, **kwargs)
            return launch

    monkeypatch.setattr(kernels, "combine_splits_kernel", Combine())
    q, k, v, prefix_lens, mask = make_case(batch=1, n=3, hq=2, hk=1, d=64, prefix=(256,), slack=1024 - 259, seed=1)
    assert k.shape[1] == 1024
    assert_matches_reference("triton", q, k, v, prefix_lens, mask)
    (lse,) = partial_lse  # [splits, B, N, Hq]; the tree's own rows see their keys in the last split only
    assert lse.shape[0] == 4
    assert torch.isfinite(lse).all(), lse


def test_bfloat16_under_the_interpreter_is_refused_naming_the_dtype():
    if not attention_module.triton_interpreting():
        pytest.skip("compiled Triton computes bfloat16")
    q, k, v, prefix_lens, mask = make_case(dtype=torch.bfloat16)
    with pytest.raises(BackendUnavailableError, match="bfloat16"):
        specdec_ops.tree_attention(q, k, v, prefix_lens, mask, backend="triton")
