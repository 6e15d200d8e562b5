"""Run a function on every rank of a small gloo world on 127.0.0.1 (tests of specdec_ops.distributed).

`run_world(world, fn, payload)` spawns `world` processes, each initializes a
gloo process group (collective timeout `timeout_s`, so a mismatched collective
fails instead of hanging), calls ``fn(rank, world, payload)`` and hands the
result back; the parent returns the per-rank results. A process still running
after `deadline_s` fails the test (killed by its pid), never hangs it.
"""

from __future__ import annotations

import datetime
import os
import socket
import tempfile
import time
import traceback

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, fn, payload, outdir, timeout_s):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        result = fn(rank, world, payload)
        torch.save({"ok": result}, os.path.join(outdir, f"{rank}.pt"))
    except BaseException:  # hand the traceback to the parent
        torch.save({"error": traceback.format_exc()}, os.path.join(outdir, f"{rank}.pt"))
        raise
    finally:
        dist.destroy_process_group()


def run_world(world: int, fn, payload, *, timeout_s: float = 60, deadline_s: float = 600) -> list:
    """Per-rank results of fn(rank, world, payload) on a fresh gloo world of `world` processes."""
    with tempfile.TemporaryDirectory() as outdir:
        ctx = mp.start_processes(_worker, args=(world, free_port(), fn, payload, outdir, timeout_s), nprocs=world,
                                 join=False, start_method="spawn")
        end = time.monotonic() + deadline_s
        try:
            while not ctx.join(timeout=1):
                if time.monotonic() > end:
                    raise TimeoutError(f"a {world}-process world did not finish within {deadline_s} s (a hang?)")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        results = []
        for rank in range(world):
            got = torch.load(os.path.join(outdir, f"{rank}.pt"), weights_only=False)
            if "error" in got:
                raise RuntimeError(f"rank {rank} failed:\n{got['error']}")
            results.append(got["ok"])
        return results


# ---------------------------------------------------------------------------------------------- workers


def shard(t, bounds, rank):
    """This rank's slice [bounds[rank], bounds[rank+1]) of the last dim of t (None stays None)."""
    return None if t is None else t[..., bounds[rank]: bounds[rank + 1]].contiguous()


def sharded_calls(rank, world, cases):
    """Run each case's sharded op on this rank's shard; a case raising returns its error's type and message.

    A case is a dict: "layout" ("padded" | "packed" | "tree"), "bounds" (rank r owns
    [bounds[r], bounds[r+1])), optional "vocab_start"/"vocab_size" overrides per
    rank (lists), "logits", "draft_probs" (full tensors, sliced here; "list_logits_ranks": the ranks
    that pass their shard as a nested list instead of a tensor) and
    "kwargs" (replicated arguments); "fixed_shapes": run the CUDA path's fixed-shape
    arithmetic (no CPU compaction) on the CPU tensors.
    """
    from specdec_ops import SpecDecArgumentError, distributed

    out = []
    for case in cases:
        distributed._CPU_COMPACTION = not case.get("fixed_shapes", False)  # True: the CUDA path's arithmetic
        bounds = case["bounds"]
        kwargs = dict(case["kwargs"])
        vocab_start = case.get("vocab_start", bounds[:-1])[rank]
        vocab_size = case.get("vocab_size", [bounds[-1]] * world)[rank]
        logits = shard(case["logits"], bounds, rank)
        if rank in case.get("list_logits_ranks", ()):  # not even a tensor on this rank
            logits = logits.tolist()
        draft_probs = shard(case.get("draft_probs"), bounds, rank)
        if case.get("check_only"):  # check_vocab_shards alone
            try:
                distributed.check_vocab_shards(vocab_start, bounds[rank + 1] - bounds[rank], vocab_size)
                out.append({"checked": True})
            except SpecDecArgumentError as e:
                out.append({"error": str(e)})
            continue
        per_rank = case.get("per_rank_kwargs", [{}] * world)[rank]
        kwargs.update(per_rank)
        if case["layout"] == "padded":
            fn = distributed.rejection_sample_logits
            args = (kwargs.pop("draft_token_ids"), kwargs.pop("num_draft_tokens"), draft_probs)
        elif case["layout"] == "packed":
            fn = distributed.rejection_sample_logits_packed
            args = (kwargs.pop("cu_num_draft_tokens"), kwargs.pop("draft_token_ids"), draft_probs)
        else:
            fn = distributed.tree_rejection_sample_logits
            args = (kwargs.pop("tree_token_ids"), kwargs.pop("parents"), kwargs.pop("num_nodes"), draft_probs)
        stats = {}
        try:
            res = fn(logits, *args, vocab_start=vocab_start, vocab_size=vocab_size, comm_stats=stats, **kwargs)
            out.append(dict(res._asdict(), stats=stats))
        except Exception as e:  # noqa: BLE001 (any error on one rank: the others must raise too, not hang)
            out.append({"error": f"{type(e).__name__}: {e}"})
    return out
