"""The configuration the CLI, the demo and the benchmarks use, in one place: ``default_setup``."""

from __future__ import annotations

import time

import torch

from .drafters import CopyCursor, CostModel, MatchLengthPrior, NGramDrafter
from . import forward as forward_mod
from .forward import CALIBRATED_ROWS, RaggedKVCache, chain_tree, forward, linear_choice, model_device, model_dtype

DEFAULT_K = 32          # the longest draft; the cost model drafts less whenever that is worth more
COPY_WINDOW = 8         # CopyCursor: a match resuming the copied text within 8 tokens goes first
MAX_MATCH = 32          # the longest n-gram matched: a longer match is likelier right (MatchLengthPrior)


def default_setup(target_model, tokenizer=None) -> dict:
    """The ``SpeculativeDecoder`` keyword arguments the CLI uses for ``target_model`` on its device.

    Prompt lookup over the request's tokens, matching the longest n-gram up to 32 tokens
    (``NGramDrafter(n=32)``), the copied text followed through small edits (:class:`CopyCursor`), and each
    draft as long as the :class:`CostModel` finds worth its verify cost: from the acceptance observed so
    far per match size, starting from :class:`MatchLengthPrior` (a longer match diverges less; no
    optimism bonus), and from this target's forward cost, measured here on its device
    (:func:`measure_forward_cost`) and then kept current from the loop's own verify forwards; chain
    drafts of at most 32 tokens. ``tokenizer`` is accepted for presets that need it (the n-gram drafter
    works on token ids and does not). ``python bench/replay_drafters.py`` compares it with the other
    configurations on the prompt sets in seconds; ``bench/bench_e2e.py`` times it.

    Use: ``SpeculativeDecoder(model, **default_setup(model, tokenizer))``.
    """
    return {"drafter": default_drafter(measure_forward_cost(target_model)), "num_speculative_tokens": DEFAULT_K,
            "tree": None}


def default_drafter(forward_cost) -> NGramDrafter:
    """The drafter of :func:`default_setup` for a target whose verify forwards cost ``forward_cost`` (a
    ``{tokens: seconds}`` table as :func:`measure_forward_cost` returns, or what :class:`CostModel` takes):
    what ``bench/replay_drafters.py`` replays from a recorded table."""
    length = CostModel(forward_cost, prior_hazard=MatchLengthPrior(), optimism=0.0, pool_sizes=False)
    return NGramDrafter(n=MAX_MATCH, length=length, rerank=[CopyCursor(COPY_WINDOW)])


COST_WIDTHS = (1, 2, 3, 4, 8, 16, 32)   # verify widths timed by measure_forward_cost


@torch.inference_mode()
def measure_forward_cost(model, prefix: int = 128, widths=COST_WIDTHS, repeat: int = 3,
                         calibrate: bool = True) -> dict[int, float]:
    """{tokens: seconds} of a verify forward of ``model`` on its device over windows of ``widths`` tokens
    after a ``prefix``-token prefill (the loop's own forward and cache): the fastest of ``repeat`` runs
    after a warm-up run each (the fastest: load on a shared machine only ever adds time). The cost model
    starts from it and follows the loop's own timings from there (:class:`ForwardCost`).

    With ``calibrate``, where the loop's CPU forwards narrow their linear layers (float32: through the
    skinny_linear kernel on one torch thread, up to ``SKINNY_ROWS`` rows; as ``W @ x^T`` on more, up to
    ``NARROW_ROWS``), the widths of ``CALIBRATED_ROWS`` among ``widths`` that narrow are timed both ways, the
    narrow product's and ``F.linear``'s (interleaved, run by run), and the faster is kept for the model from then
    on; with ``W @ x^T`` the rows above the timed ones up to ``NARROW_ROWS`` follow the largest timed one
    (``linear_choice(model).blas_rows``, every forward of the loop and its drafters); the table holds the kept
    path's time. Over one to four rows a CPU's BLAS may be as fast as the kernel or faster (an Intel Xeon's MKL:
    forwards of SmolLM2-135M over 1-3 tokens within about 10% of the kernel's either way, from run to run; the
    end-to-end runs of 2026-12-07 kept F.linear at all three) or far slower (an AMD EPYC: a one-token forward 61 ms
    against the kernel's 39). Without ``calibrate`` every width runs the model's current choice. With two threads
    an Intel Xeon's MKL runs 1-5 rows 1.4-2.4x faster through ``F.linear`` than as ``W @ x^T``; an AMD EPYC's BLAS
    the other way round."""
    device, dtype = model_device(model), model_dtype(model)
    vocab = int(model.config.vocab_size)
    cache = RaggedKVCache(model, 1, prefix + max(widths) + 1, device, dtype)
    tokens = torch.arange(prefix, device=device)[None] % vocab
    mask, depth = chain_tree(prefix, 1, device)
    forward(model, cache, tokens, cache.seq_lens, depth, mask, logits_at=torch.tensor([prefix - 1], device=device),
            start_range=(0, 0))
    cache.seq_lens.fill_(prefix)
    choice = linear_choice(model)
    narrow = forward_mod.narrow_rows() if calibrate and torch.device(device).type == "cpu" and \
        dtype == torch.float32 else 0
    timed = [width for width in widths if width in CALIBRATED_ROWS and width <= narrow]
    paths = {width: ("narrow", "blas") if width in timed else ("kept",) for width in widths}
    times = {(width, path): float("inf") for width in widths for path in paths[width]}
    kept = choice.blas_rows
    try:
        for run in range(repeat + 1):                        # the first round warms up; widths interleaved
            for width in widths:
                ids = torch.arange(width, device=device)[None] % vocab
                mask, depth = chain_tree(width, 1, device)
                for path in paths[width]:
                    if path != "kept":
                        choice.blas_rows = kept | {width} if path == "blas" else kept - {width}
                    _synchronize(device)
                    start = time.perf_counter()
                    forward(model, cache, ids, cache.seq_lens, depth, mask, start_range=(prefix, prefix))
                    _synchronize(device)
                    if run:
                        times[width, path] = min(times[width, path], time.perf_counter() - start)
                    choice.blas_rows = kept
        for width in timed:
            faster = times[width, "blas"] < times[width, "narrow"]
            kept = kept | {width} if faster else kept - {width}
        if timed and narrow < forward_mod.SKINNY_ROWS:  # W @ x^T: the rows above the timed ones follow the last
            top = max(timed)
            rest = set(range(top + 1, narrow + 1))
            kept = kept | rest if top in kept else kept - rest
    finally:
        choice.blas_rows = kept
    return {width: min(times[width, path] for path in paths[width]) for width in widths}


def _synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
