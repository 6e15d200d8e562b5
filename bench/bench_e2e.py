"""End-to-end speculative decoding on a prompt set: SmolLM2-135M-Instruct, greedy, batch 1.

The prompts (bench/prompts.json) come in four categories -- rewrite (rewriting or editing a given text),
code (edits on given code), extract (extraction or summarization of a given text), open (open-ended
writing or explanation) -- each split into a tuning half (the presets were chosen on it) and a held-out
half. Methods, all in this process, with the chat template:
  plain      model.generate(do_sample=False)
  lookup     transformers' prompt lookup, prompt_lookup_num_tokens=10 (its default)
  default    SpeculativeDecoder(model, **default_setup(model, tokenizer)): what the CLI runs
  ngram      SpeculativeDecoder(model, NGramDrafter(), num_speculative_tokens=10): classic prompt lookup
  (--variants adds configurations under study: nocursor = default without CopyCursor, bymatch =
  ByMatchLength((0, 16, 32)) with CopyCursor, k = 32, linear = default with the loop's forward through
  F.linear in every layer, narrow_linears off, its cost table measured so)
  (--ceiling adds the bounds every drafter in this loop lies between:
  oracle     a perfect drafter (ReplayDrafter): it drafts the tokens plain generate produced for the
             prompt, at each step the length that emits most tokens per verify cost (all accepted), at
             most 32 -- the same window as default; no drafter in this loop can beat it
  copy       the perfect copier (ReplayDrafter(copy_only=True)): as oracle, but it drafts only the longest
             start of the true continuation that occurs somewhere in the request's tokens so far (prompt and
             output): no drafter that copies from the context (prompt lookup of any n, suffix matching,
             a trie of matches) can beat it
  match      the perfect prompt lookup (ReplayDrafter(match_only=True)): as copy, but only continuations
             that follow an earlier occurrence of the last token (every n-gram match's, any n, any tie
             rule): no prompt-lookup drafter, whatever its length policy, can beat it
  nodraft    the loop with no drafts at all (ByMatchLength((0,))): one verify forward per token, the
             loop's own cost per step against plain generate's)
Each round runs every method on every prompt, interleaved prompt by prompt (fair under drifting load);
each (method, prompt) reports its median round. tokens/s = generated tokens / wall time (prefill
included); ratios of a category are of its summed tokens over its summed time, by wall time and by this
process's CPU time (on a shared machine the wall time also counts other processes). `same`: tokens
identical to plain generate's.

    python bench/bench_e2e.py [--split all|tune|heldout] [--prompts bench/prompts_heldout.json]
                              [--max-new-tokens 96] [--rounds 2] [--threads 1]
                              [--json out.json] [--plot out.png] [--variants] [--ceiling] [--methods a,b]
                              [--quick]
    python bench/bench_e2e.py --replot out.json [--plot out.png]

--threads defaults to 1 on CPU: on a small shared machine torch's intra-op threads mostly wait on each
other; every method runs with the same setting. --plot draws with matplotlib when it is installed, else with bench/charts.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from charts import bar_chart  # noqa: E402
from common import base_parser, nvtx_range, synchronize  # noqa: E402

import torch  # noqa: E402

from specdec_ops.decoding.types import chain_draft  # noqa: E402

PROMPTS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prompts.json")
CATEGORIES = ("rewrite", "code", "extract", "open")
GROUNDED = ("rewrite", "code", "extract")


def load_prompts(split: str = "all", path: str = PROMPTS_PATH) -> list[dict]:
    """The prompt set: dicts with category, split ("tune" / "heldout") and text."""
    with open(path) as f:
        prompts = json.load(f)["prompts"]
    return [p for p in prompts if split == "all" or p["split"] == split]


@contextlib.contextmanager
def linear_forward():
    """The loop's forward with every linear layer through F.linear (narrow_linears off): the "linear"
    variant, default_setup as it was before the narrow products."""
    from specdec_ops.decoding import forward as forward_mod

    rows = forward_mod.NARROW_ROWS
    forward_mod.NARROW_ROWS = 0
    try:
        yield
    finally:
        forward_mod.NARROW_ROWS = rows


def main() -> None:
    parser = base_parser("End-to-end speculative decoding on a prompt set vs plain generate and prompt lookup")
    parser.add_argument("--split", default="all", choices=["all", "tune", "heldout"])
    parser.add_argument("--prompts", default=PROMPTS_PATH,
                        help="prompt set (default bench/prompts.json; bench/prompts_heldout.json: 8 prompts written "
                             "after the presets were fixed)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=None, help="rounds over every prompt (default 2, --quick 1)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1 on CPU)")
    parser.add_argument("--target", default=None, help="HF directory or .gguf (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--variants", action="store_true", help="also run the configurations under study")
    parser.add_argument("--ceiling", action="store_true",
                        help="also run the bounds: a perfect drafter (oracle), a perfect copier (copy), a perfect prompt lookup (match), "
                             "no drafter (nodraft)")
    parser.add_argument("--methods", default=None,
                        help="comma-separated methods to run (plain and lookup always run: the ratios' bases)")
    parser.add_argument("--plot", default=None, help="save a PNG of the per-category speedups")
    parser.add_argument("--replot", default=None, metavar="JSON",
                        help="only draw --plot from the results a previous --json run saved")
    args = parser.parse_args()
    if args.replot:
        with open(args.replot) as f:
            saved = json.load(f)
        methods = list(dict.fromkeys(r["method"] for r in saved["rows"]))
        plot(saved["summary"], methods, args.plot or os.path.splitext(args.replot)[0] + ".png")
        return
    if args.device == "cpu":
        torch.set_num_threads(args.threads or 1)
    elif args.threads:
        torch.set_num_threads(args.threads)

    from specdec_ops.__main__ import encode_prompt
    from specdec_ops.decoding import (ByMatchLength, CopyCursor, CostModel, MatchLengthPrior, NGramDrafter,
                                      SpeculativeDecoder, default_setup)
    from specdec_ops.decoding.models import default_target, load_model

    rounds = args.rounds or (1 if args.quick else 2)
    max_new = 32 if args.quick and args.max_new_tokens == 96 else args.max_new_tokens
    prompts = load_prompts(args.split, args.prompts)
    if args.quick:
        prompts = [next(p for p in prompts if p["category"] == c) for c in CATEGORIES]
    model, tokenizer = load_model(args.target or default_target(), args.device)
    eos = tokenizer.eos_token_id
    ids = [encode_prompt(tokenizer, p["text"], chat=True) for p in prompts]

    setup = default_setup(model, tokenizer)
    cost = dict(setup["drafter"].length.points)
    decoders = {"default": SpeculativeDecoder(model, **setup),
                "ngram": SpeculativeDecoder(model, NGramDrafter(), num_speculative_tokens=10)}
    if args.variants:
        nocursor = NGramDrafter(n=32, length=CostModel(cost, prior_hazard=MatchLengthPrior(), optimism=0.0,
                                                       pool_sizes=False))
        decoders["nocursor"] = SpeculativeDecoder(model, nocursor, num_speculative_tokens=32)
        decoders["bymatch"] = SpeculativeDecoder(
            model, NGramDrafter(n=3, length=ByMatchLength((0, 16, 32)), rerank=[CopyCursor(8)]),
            num_speculative_tokens=32)
        with linear_forward():                  # its cost model measures the forward it will run
            decoders["linear"] = SpeculativeDecoder(model, **default_setup(model, tokenizer))

    oracle = None
    if args.ceiling:
        oracle = ReplayDrafter(setup["drafter"].length.forward)
        copier = ReplayDrafter(setup["drafter"].length.forward, copy_only=True)
        matcher = ReplayDrafter(setup["drafter"].length.forward, match_only=True)
        decoders["oracle"] = SpeculativeDecoder(model, oracle, num_speculative_tokens=setup["num_speculative_tokens"])
        decoders["copy"] = SpeculativeDecoder(model, copier, num_speculative_tokens=setup["num_speculative_tokens"])
        decoders["match"] = SpeculativeDecoder(model, matcher, num_speculative_tokens=setup["num_speculative_tokens"])
        decoders["nodraft"] = SpeculativeDecoder(model, NGramDrafter(length=ByMatchLength((0,))),
                                                 num_speculative_tokens=1)

    def hf(p, lookup=None):
        x = torch.tensor([p], device=args.device)
        extra = {} if lookup is None else {"prompt_lookup_num_tokens": lookup}
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos, **extra)
        return out[0, len(p):].tolist(), None

    def ours(decoder, name):
        def run(p):
            with linear_forward() if name == "linear" else contextlib.nullcontext():
                out = decoder.generate([p], max_new_tokens=max_new, eos_token_id=eos)
            return out.sequences[0], out.stats
        return run

    methods = {"plain": hf, "lookup": lambda p: hf(p, 10), **{name: ours(d, name) for name, d in decoders.items()}}
    if args.methods:
        chosen = set(args.methods.split(",")) | {"plain", "lookup"}
        unknown = chosen - set(methods)
        if unknown:
            parser.error(f"--methods: unknown {sorted(unknown)}; available: {', '.join(methods)}")
        methods = {name: fn for name, fn in methods.items() if name in chosen}
    print(f"device={args.device} threads={torch.get_num_threads()} max_new_tokens={max_new} split={args.split} "
          f"prompts={len(prompts)} rounds={rounds}", flush=True)
    from specdec_ops.decoding.forward import linear_choice
    blas_rows = sorted(linear_choice(model).blas_rows)
    print("verify forward cost (ms) by tokens: " + ", ".join(f"{t}: {c * 1e3:.0f}" for t, c in cost.items())
          + f"; F.linear (not skinny_linear) at rows {blas_rows}", flush=True)

    with torch.inference_mode():
        for fn in methods.values():                                   # warm-up
            fn(ids[0][:64])
        runs = {name: [[] for _ in prompts] for name in methods}     # per method, per prompt: rounds
        for r in range(rounds):
            for i, p in enumerate(ids):
                for name, fn in methods.items():
                    if oracle is not None and runs["plain"][i]:   # plain runs first: the oracles' drafts
                        oracle.reference = copier.reference = matcher.reference = (p, runs["plain"][i][0]["tokens"])
                    with nvtx_range(f"e2e-{name}", args.device):
                        synchronize(args.device)
                        start, cpu = time.perf_counter(), time.process_time()
                        tokens, stats = fn(p)
                        synchronize(args.device)
                        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
                    runs[name][i].append({"tokens": tokens, "seconds": seconds, "cpu_seconds": cpu,
                                          "forwards": None if stats is None else stats.target_forwards})
            print(f"round {r + 1}/{rounds} done", flush=True)

    rows = []
    for i, prompt in enumerate(prompts):
        reference = runs["plain"][i][0]["tokens"]
        for name in methods:
            seconds = statistics.median(x["seconds"] for x in runs[name][i])
            cpu = statistics.median(x["cpu_seconds"] for x in runs[name][i])
            first = runs[name][i][0]
            rows.append({"category": prompt["category"], "split": prompt["split"], "prompt": i, "method": name,
                         "tokens": len(first["tokens"]), "seconds": seconds, "cpu_seconds": cpu,
                         "forwards": first["forwards"],
                         "same": all(x["tokens"] == reference for x in runs[name][i])})
    summary = summarize(rows, list(methods))
    print_tables(summary, rows, list(methods))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {"device": args.device, "threads": torch.get_num_threads(), "max_new_tokens": max_new,
                                  "rounds": rounds, "split": args.split, "forward_cost": cost, "blas_rows": blas_rows,
                                  "prompts": os.path.relpath(args.prompts, os.path.dirname(PROMPTS_PATH)),
                                  "load_average": os.getloadavg()},
                       "rows": rows, "summary": summary}, f, indent=1)
    if args.plot or args.json:  # a picture beside the JSON
        plot(summary, list(methods), args.plot or os.path.splitext(args.json)[0] + ".png")


class ReplayDrafter:
    """A perfect drafter, for the ceiling of this loop: it drafts the tokens plain greedy decoding produced
    (``reference = (prompt, generated tokens)``, set before each run; batch 1), at each step the length n
    that maximizes (n + 1) / cost(n + 1) by the verify-forward cost ``forward_cost`` (a
    :class:`~specdec_ops.decoding.ForwardCost`: padded to its cheapest window), every draft accepted when
    the loop is token-identical to plain generate (a near-tie that is not only costs a rejection).

    ``copy_only``: draft only the longest start of the true continuation that occurs anywhere in the
    request's tokens so far (the ceiling of every drafter that copies from its context).
    ``match_only``: draft only the longest start of the true continuation that follows an earlier
    occurrence of the request's last token (the ceiling of prompt lookup: every n-gram match, of any n
    and by any tie rule, continues after such an occurrence, and no length policy drafts better)."""

    vocab_size = None

    def __init__(self, forward_cost, copy_only: bool = False, match_only: bool = False):
        if copy_only and match_only:
            raise ValueError("ReplayDrafter: copy_only and match_only exclude each other")
        self.cost = forward_cost
        self.copy_only = copy_only
        self.match_only = match_only
        self.reference: tuple[list[int], list[int]] = ([], [])

    def reset(self, batch, capacity, vocab_size):
        if len(batch) != 1:
            raise ValueError("ReplayDrafter drafts for batch 1 only")

    def keep(self, rows):
        pass

    def commit(self, accepted_path, num_accepted):
        pass

    def propose(self, batch, k, tree, sampling):
        prompt, generated = self.reference
        history = batch.history[0]
        done = len(history) - len(prompt)                   # generated so far, the root included
        cont = generated[done:done + max(min(k, batch.remaining()[0] - 1), 0)]
        if self.copy_only:
            cont = cont[:longest_copy(history, cont)]
        elif self.match_only:
            cont = cont[:longest_match_continuation(history, cont)]
        windows = [self.cost.cheapest(1, n + 1, 1 + k) for n in range(len(cont) + 1)]   # (width, cost)
        best = max(range(len(cont) + 1), key=lambda n: ((n + 1) / windows[n][1], -n))
        width = windows[best][0]
        row = [history[-1]] + cont[:best] + [0] * (width - 1 - best)
        return chain_draft(torch.tensor([row], dtype=torch.int64, device=batch.device),
                           torch.tensor([1 + best], dtype=torch.int64, device=batch.device))


def longest_copy(tokens: list[int], cont: list[int]) -> int:
    """The largest L such that ``cont[:L]`` occurs as a run of consecutive entries of ``tokens``."""
    best = 0
    for s in range(len(tokens)):
        n = 0
        while n < len(cont) and s + n < len(tokens) and tokens[s + n] == cont[n]:
            n += 1
        best = max(best, n)
    return best


def longest_match_continuation(tokens: list[int], cont: list[int]) -> int:
    """The largest L such that ``cont[:L]`` equals the tokens right after an earlier occurrence of
    ``tokens[-1]`` (what prompt lookup can draft: the continuation of an n-gram match, n >= 1)."""
    best = 0
    for end in range(len(tokens) - 1):
        if tokens[end] != tokens[-1]:
            continue
        n = 0
        while n < len(cont) and end + 1 + n < len(tokens) and tokens[end + 1 + n] == cont[n]:
            n += 1
        best = max(best, n)
    return best


def summarize(rows: list[dict], methods: list[str]) -> dict:
    """Per split (tune, heldout, all) and group (each category, grounded = rewrite + code + extract): per
    method tokens/s and its ratio to plain and to prompt lookup, by wall time and by this process's CPU
    time (``_cpu``: what other processes on a shared machine take does not count); per open-ended prompt
    each method vs plain."""
    out = {}
    for split in ("tune", "heldout", "all"):
        chosen = [r for r in rows if split == "all" or r["split"] == split]
        if not chosen:
            continue
        groups = {c: (c,) for c in CATEGORIES}
        groups["grounded"] = GROUNDED
        table = {}
        for group, cats in groups.items():
            sel = [r for r in chosen if r["category"] in cats]
            if not sel:
                continue
            rate = {m: sum(r["tokens"] for r in sel if r["method"] == m) /
                    sum(r["seconds"] for r in sel if r["method"] == m) for m in methods}
            cpu = {m: sum(r["tokens"] for r in sel if r["method"] == m) /
                   sum(r["cpu_seconds"] for r in sel if r["method"] == m) for m in methods}
            table[group] = {m: {"tokens_per_s": rate[m], "vs_plain": rate[m] / rate["plain"],
                                "vs_lookup": rate[m] / rate["lookup"], "vs_plain_cpu": cpu[m] / cpu["plain"],
                                "vs_lookup_cpu": cpu[m] / cpu["lookup"],
                                "same": all(r["same"] for r in sel if r["method"] == m)} for m in methods}
        per_prompt = {}
        for r in chosen:
            if r["category"] == "open" and r["method"] != "plain":
                plain = next(x for x in chosen if x["prompt"] == r["prompt"] and x["method"] == "plain")
                per_prompt.setdefault(r["method"], []).append(plain["seconds"] / r["seconds"] *
                                                              r["tokens"] / max(plain["tokens"], 1))
                per_prompt.setdefault(r["method"] + "_cpu", []).append(
                    plain["cpu_seconds"] / r["cpu_seconds"] * r["tokens"] / max(plain["tokens"], 1))
        out[split] = {"groups": table, "open_vs_plain_per_prompt": per_prompt}
    return out


def print_tables(summary: dict, rows: list[dict], methods: list[str]) -> None:
    for split, data in summary.items():
        print(f"\n== {split}: tokens/s (x plain generate, x prompt lookup 10)")
        print("| category | " + " | ".join(methods) + " |")
        print("| --- |" + " --- |" * len(methods))
        for group, per in data["groups"].items():
            cells = [f"{per[m]['tokens_per_s']:.1f} ({per[m]['vs_plain']:.2f}x, {per[m]['vs_lookup']:.2f}x)"
                     + ("" if per[m]["same"] else " DIFFERENT") for m in methods]
            print(f"| {group} | " + " | ".join(cells) + " |")
        print(f"\n== {split}, by CPU time: x plain generate, x prompt lookup 10")
        for group, per in data["groups"].items():
            print(f"| {group} | " + " | ".join(f"{per[m]['vs_plain_cpu']:.2f}x, {per[m]['vs_lookup_cpu']:.2f}x"
                                                for m in methods) + " |")
        for m, ratios in data["open_vs_plain_per_prompt"].items():
            print(f"open-ended prompts, {m} vs plain, each: " + ", ".join(f"{x:.2f}x" for x in ratios))
    forwards = {m: [r["forwards"] for r in rows if r["method"] == m] for m in methods}
    for m, f in forwards.items():
        if f and f[0] is not None:
            print(f"{m}: verify forwards per prompt {f}")


def plot(summary: dict, methods: list[str], path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the same numbers as grouped bars in one picture (bench/charts.py)
        shown = [m for m in methods if m != "plain"]
        labels = [(split, g) for split in summary for g in summary[split]["groups"]]
        bar_chart(path, "TOKENS/S VS PLAIN GENERATE, PER PROMPT SET: CATEGORY",
                  [f"{split[:4]}:{g[:4]}" for split, g in labels],
                  {m: [summary[split]["groups"][g][m]["vs_plain"] for split, g in labels] for m in shown},
                  reference=1.0)
        print(f"plot saved to {path}")
        return
    splits = list(summary)
    fig, axes = plt.subplots(1, len(splits), figsize=(5 * len(splits), 4), squeeze=False)
    shown = [m for m in methods if m != "plain"]
    for ax, split in zip(axes[0], splits):
        groups = list(summary[split]["groups"])
        width = 0.8 / len(shown)
        for j, m in enumerate(shown):
            ax.bar([g + j * width for g in range(len(groups))],
                   [summary[split]["groups"][g][m]["vs_plain"] for g in groups], width, label=m)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))], groups)
        ax.set_title(f"{split}: tokens/s vs plain generate")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot saved to {path}")


if __name__ == "__main__":
    main()
