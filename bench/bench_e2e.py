"""End-to-end speculative decoding: SmolLM2-135M-Instruct, greedy, 128 new tokens.

Same process, same prompts (code writing, rewriting a given text, a structured list), chat template:
  plain      model.generate(do_sample=False)
  lookupN    transformers' assisted generation with prompt lookup, prompt_lookup_num_tokens=N (10, its
             default, and 16 by default: --lookup-tokens)
  chain      SpeculativeDecoder + NGramDrafter(resume_window=8, resume_after_edit=2, word_starts=...), chain
             drafts (on a CPU lengths=(0, 16, 32): none after a 1-token match, 16 tokens after a 2-token
             one, 32 after longer ones; and forward_overhead=16: a batch's drafts cut to one width worth
             its cost)
  tree       SpeculativeDecoder + NGramDrafter, trie of several matches, one forward per tree
At batch 1 every method decodes the prompts one after another; then the loop decodes batches of 4 and
8 ragged prompts at once (transformers has no batched speculative path). tokens/s counts generated
tokens over wall time; `same` says whether the tokens equal plain generate's, request by request.

    python bench/bench_e2e.py [--quick] [--max-new-tokens 128] [--threads 1] [--device cpu|cuda] [--json out.json]

--threads defaults to 1 on CPU: on a small shared machine torch's intra-op threads mostly wait on each
other (measured ~10x slower forwards with 2 threads on 2 busy cores); every method runs with the same
setting. On CUDA the target uses the "specdec_tree" attention (tree_attention kernel) for verification.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Table, base_parser, nvtx_range, profiled_region, synchronize  # noqa: E402

import torch  # noqa: E402

PROMPTS = [
    # code writing (on given code)
    "Add type hints and a one-line docstring to every function in this Python code, and return the full "
    "code:\n\n```python\ndef area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n"
    "    return 2 * (width + height)\n\n\ndef is_square(width, height):\n    return width == height\n```",
    # rewriting a given text
    "Fix the spelling mistakes in the following text and return the corrected text:\n\n"
    "The new bild is out and it fixs the login bug that many users reportd last week. We also made the serch "
    "page much faster, it now loads in about half the time. The mobile app update is coming next Tusday. "
    "If you see anything wierd, please open a tikcet so we can look at it quickly.",
    # a structured list
    "Turn this text into a numbered list with one fact per line:\n\n"
    "Mercury is the closest planet to the Sun. Venus is the hottest planet. Earth is the only planet known to "
    "have life. Mars is called the Red Planet. Jupiter is the largest planet. Saturn has the most visible rings. "
    "Uranus rotates on its side. Neptune has the strongest winds.",
    # extra prompts for the batch runs
    "Write a Python class `Stack` with push, pop, peek and is_empty methods, with type hints and docstrings.",
    "Rewrite this sentence three times, each time more concise: The meeting that was scheduled to take place on "
    "Monday has been moved to Wednesday because several of the participants are not available on Monday.",
    "Give a step-by-step checklist for preparing a small web service for production: one line per step, "
    "each starting with a verb.",
    "Convert this list to JSON with keys name and price: apples 3 dollars, bread 2 dollars, milk 1 dollar, "
    "cheese 5 dollars, coffee 7 dollars.",
    "Summarize the rules of tic-tac-toe as a numbered list of short rules.",
]


def main() -> None:
    parser = base_parser("End-to-end speculative decoding vs plain generate and prompt lookup (SmolLM2-135M)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1 on CPU)")
    parser.add_argument("--target", default=None, help="HF directory or .gguf (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--k", type=int, default=None,
                        help="longest n-gram draft (chain) / deepest path (tree) (default: the longest --lengths "
                             "entry, else 10)")
    parser.add_argument("--lengths", default="auto",
                        help="NGramDrafter(lengths=...): draft length after a 1-, 2-, 3+-token match, comma-separated; "
                             "'none': k for any match; 'auto' (default): 0,16,32 on a CPU, none on a GPU")
    parser.add_argument("--tree", type=int, default=16, help="tree budget (nodes besides the root)")
    parser.add_argument("--resume", type=int, default=8, help="NGramDrafter(resume_window=...); 0 = off")
    parser.add_argument("--edit", type=int, default=2,
                        help="NGramDrafter(resume_after_edit=...) with the tokenizer's word starts; 0 = off")
    parser.add_argument("--forward-overhead", default="auto",
                        help="NGramDrafter(forward_overhead=...) for the batches: 'none', a number, or 'auto' (16 on a "
                             "CPU, none on a GPU)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="rounds of the batch-1 runs; each method reports its median round (default 3, --quick 1)")
    parser.add_argument("--batch-sizes", default=None,
                        help="comma-separated batch sizes after batch 1 (default 4,8; --quick 4; '' = none)")
    parser.add_argument("--min-n", type=int, default=1, help="shortest n-gram the drafter matches")
    parser.add_argument("--adaptive", action="store_true", help="NGramDrafter(adaptive=True)")
    parser.add_argument("--lookup-tokens", default="10,16",
                        help="prompt_lookup_num_tokens for transformers, comma-separated: one baseline each; the first "
                             "(10 = transformers' default) is the one vs_lookup divides by")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(args.threads or 1)
    elif args.threads:
        torch.set_num_threads(args.threads)

    from specdec_ops.__main__ import ngram_lengths
    from specdec_ops.decoding import NGramDrafter, SpeculativeDecoder, word_starts
    from specdec_ops.decoding.cache import vocab_size
    from specdec_ops.decoding.models import default_target, load_model

    max_new = 32 if args.quick and args.max_new_tokens == 128 else args.max_new_tokens
    args.repeat = args.repeat or (1 if args.quick else 3)
    lookup_tokens = [int(x) for x in args.lookup_tokens.split(",")]
    lengths = ngram_lengths(args.lengths, args.device)
    args.k = args.k or (max(lengths) if lengths else 10)
    overhead = {"auto": 16.0 if args.device == "cpu" else None, "none": None}.get(args.forward_overhead)
    if args.forward_overhead not in ("auto", "none"):
        overhead = float(args.forward_overhead)
    model, tokenizer = load_model(args.target or default_target(), args.device)
    if args.device == "cuda":
        import specdec_ops.hf_attention  # noqa: F401  (registers "specdec_tree")
        model.set_attn_implementation("specdec_tree")
    eos = tokenizer.eos_token_id
    prompts = [_encode(tokenizer, p) for p in PROMPTS]
    main_prompts = prompts[:1] if args.quick else prompts[:3]
    print(f"device={args.device} threads={torch.get_num_threads()} max_new_tokens={max_new} "
          f"prompts={len(main_prompts)} k={args.k} lengths={lengths} resume={args.resume} edit={args.edit} "
          f"forward_overhead={overhead} tree={args.tree} "
          f"min_n={args.min_n} "
          f"adaptive={args.adaptive} lookup={lookup_tokens}", flush=True)

    def plain(p):
        ids = torch.tensor([p], device=args.device)
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False,
                              eos_token_id=eos, pad_token_id=eos)[0, len(p):].tolist()

    def lookup(num_tokens):
        def run(p):
            ids = torch.tensor([p], device=args.device)
            return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                                  do_sample=False, eos_token_id=eos, pad_token_id=eos,
                                  prompt_lookup_num_tokens=num_tokens)[0, len(p):].tolist()
        return run

    starts = word_starts(tokenizer, vocab_size(model)) if args.edit else None

    def drafter():
        return NGramDrafter(n=3, min_n=args.min_n, adaptive=args.adaptive, lengths=lengths, resume_window=args.resume,
                            resume_after_edit=args.edit, word_starts=starts, forward_overhead=overhead)

    chain_dec = SpeculativeDecoder(model, drafter(), num_speculative_tokens=args.k)
    tree_dec = SpeculativeDecoder(model, drafter(), num_speculative_tokens=args.k, tree=args.tree)
    baselines = {"plain": plain, **{f"lookup{n}": lookup(n) for n in lookup_tokens}}
    lookup_name = f"lookup{lookup_tokens[0]}"
    methods = {**baselines,
               "chain": lambda p: _ours(chain_dec, [p], max_new, eos),
               "tree": lambda p: _ours(tree_dec, [p], max_new, eos)}

    with torch.inference_mode():
        _warmup(main_prompts[0], chain_dec, tree_dec, eos, args.device)

        table = Table(["batch", "method", "tokens", "seconds", "tokens_per_s", "vs_plain", "vs_lookup",
                       "vs_best_lookup", "mean_accepted", "same"])
        # per method and round: tokens, seconds, emitted tokens, verify forwards, identical to plain
        rounds = {name: [] for name in methods}
        with profiled_region(args.device):
            for _ in range(args.repeat):
                tally = {name: [0, 0.0, 0, 0, True] for name in methods}
                for p in main_prompts:   # interleave the methods prompt by prompt (fair under drifting load)
                    ref = None
                    for name, fn in methods.items():
                        with nvtx_range(f"e2e-{name}", args.device):
                            synchronize(args.device)
                            start = time.perf_counter()
                            out = fn(p)
                            synchronize(args.device)
                            seconds = time.perf_counter() - start
                        tokens, stats = out if isinstance(out, tuple) else (out, None)
                        tokens = tokens[0] if stats is not None else tokens
                        if name == "plain":
                            ref = tokens
                        t = tally[name]
                        t[0] += len(tokens)
                        t[1] += seconds
                        if stats is not None:
                            t[2] += stats.generated_tokens
                            t[3] += stats.target_forwards
                        t[4] &= tokens == ref
                for name, t in tally.items():
                    rounds[name].append(t)
        # each method's round with the median time (rounds interleave the methods, so they share the load)
        totals = {name: sorted(r, key=lambda t: t[1])[len(r) // 2] for name, r in rounds.items()}
        tps = {name: t[0] / t[1] for name, t in totals.items()}
        best_lookup = max(tps[f"lookup{n}"] for n in lookup_tokens)
        for name, t in totals.items():
            table.add(batch=1, method=name, tokens=t[0], seconds=t[1], tokens_per_s=tps[name],
                      vs_plain=tps[name] / tps["plain"], vs_lookup=tps[name] / tps[lookup_name],
                      vs_best_lookup=tps[name] / best_lookup, mean_accepted=(t[2] / t[3]) if t[3] else None,
                      same=all(r[4] for r in rounds[name]))
        print(f"vs_plain / vs_lookup / vs_best_lookup: tokens/s relative to plain generate / prompt lookup with "
              f"{lookup_tokens[0]} tokens / the fastest prompt lookup setting ({lookup_tokens}), each decoding the "
              f"same prompts one by one; batch 1: median of {args.repeat} interleaved rounds; same: tokens identical "
              "to plain generate's", flush=True)

        # batches: the loop decodes B ragged prompts at once; the baselines decode the same prompts one by one
        batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b] if args.batch_sizes is not None else (
            [4] if args.quick else [4, 8])
        if not batch_sizes:
            table.write_json(args.json)
            return
        timed = {name: [] for name in baselines}   # per prompt: (tokens, seconds, tokens list)
        for i in range(max(batch_sizes)):
            for name, fn in baselines.items():
                start = time.perf_counter()
                tokens = fn(prompts[i])
                timed[name].append((len(tokens), time.perf_counter() - start, tokens))
        for bsz in batch_sizes:
            batch_prompts = prompts[:bsz]
            refs = [t[2] for t in timed["plain"][:bsz]]
            base = {name: sum(t[0] for t in v[:bsz]) / sum(t[1] for t in v[:bsz]) for name, v in timed.items()}
            best = max(base[f"lookup{n}"] for n in lookup_tokens)
            for name, v in timed.items():
                table.add(batch=bsz, method=f"{name} (1 by 1)", tokens=sum(t[0] for t in v[:bsz]),
                          seconds=sum(t[1] for t in v[:bsz]), tokens_per_s=base[name],
                          vs_plain=base[name] / base["plain"], vs_lookup=base[name] / base[lookup_name],
                          vs_best_lookup=base[name] / best, mean_accepted=None,
                          same=[t[2] for t in v[:bsz]] == refs)
            for name, dec in (("chain", chain_dec), ("tree", tree_dec)):
                synchronize(args.device)
                start = time.perf_counter()
                out = dec.generate(batch_prompts, max_new_tokens=max_new, eos_token_id=eos)
                synchronize(args.device)
                seconds = time.perf_counter() - start
                tokens = sum(len(s) for s in out.sequences)
                rate = tokens / seconds
                table.add(batch=bsz, method=name, tokens=tokens, seconds=seconds, tokens_per_s=rate,
                          vs_plain=rate / base["plain"], vs_lookup=rate / base[lookup_name],
                          vs_best_lookup=rate / best, mean_accepted=out.stats.mean_accepted_length,
                          same=out.sequences == refs)
        table.write_json(args.json)


def _ours(decoder, prompts, max_new, eos):
    out = decoder.generate(prompts, max_new_tokens=max_new, eos_token_id=eos)
    return out.sequences, out.stats


def _warmup(prompt, chain_dec, tree_dec, eos, device):
    ids = torch.tensor([prompt], device=device)
    chain_dec.target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False,
                              eos_token_id=eos, pad_token_id=eos)
    chain_dec.generate([prompt], max_new_tokens=4, eos_token_id=eos)
    tree_dec.generate([prompt], max_new_tokens=4, eos_token_id=eos)


def _encode(tokenizer, text):
    from specdec_ops.__main__ import encode_prompt

    return encode_prompt(tokenizer, text, chat=True)


if __name__ == "__main__":
    main()
