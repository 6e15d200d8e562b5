"""Every ```python block of README.md runs and does what its comments say.

Each block is a test case named after its section heading (a number appended where a section holds
several). A block is either run (``RUN``: as written, or after the substitutions its entry states, applied
here in code) or skipped with a reason (``SKIP``: fragments, pseudo-signatures); a block in neither, or in
both, fails ``test_every_python_block_is_run_or_skipped``, so a new example cannot go untested unnoticed.

Substitutions, all on CPU:
- "Python API": a tiny random-weight Llama (100 tokens, 2 layers) for ``target_model`` / ``model``,
  ``tokenizer = None`` (``default_setup`` does not use it), three small ragged prompts;
- "Hugging Face models": the same tiny Llama (SDPA), switched by the block itself; the tree of "Tree
  attention masks" with ``prefix_lens = [10, 10]`` (a DynamicCache holds one length for every request) and a
  DynamicCache prefilled with 10 random tokens;
- "Tensor-parallel verification": the block saved as tp_verify.py and run with torchrun as its first line
  says, plus ``--standalone`` (a free rendezvous port), on gloo with 2 CPU ranks.
Continuation blocks (they use names an earlier block defines) run after that block, in its namespace.

Also checked: the pseudo-signatures of the kv_commit block name the functions' parameters, the CLI flag
table lists exactly ``python -m specdec_ops generate``'s options, and every ``--flag`` of a
``python bench/X.py`` command in the text is defined by that script (or bench/common.py).
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch

import specdec_ops

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one torch thread (conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")


# ------------------------------------------------------------------------------------------- parsing


def _slug(heading: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")


def readme_blocks() -> list[dict]:
    """Every fenced block: lang, heading (the latest section heading above it), line (of its first code line),
    code; python blocks also get a key (the heading's slug, -1, -2, ... where the heading has several)."""
    lines = open(README, encoding="utf-8").read().split("\n")
    blocks, heading, i = [], None, 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            j = i + 1
            while not lines[j].startswith("```"):
                j += 1
            blocks.append({"lang": line[3:].strip(), "heading": heading, "line": i + 2,
                           "code": "\n".join(lines[i + 1:j]) + "\n"})
            i = j + 1
            continue
        if re.match(r"#{1,6} ", line):
            heading = line.lstrip("#").strip()
        i += 1
    python = [b for b in blocks if b["lang"] == "python"]
    for b in python:
        same = [c for c in python if c["heading"] == b["heading"]]
        b["key"] = _slug(b["heading"]) + (f"-{same.index(b) + 1}" if len(same) > 1 else "")
    return blocks


BLOCKS = readme_blocks()
PYTHON = {b["key"]: b for b in BLOCKS if b["lang"] == "python"}


def _after(key: str) -> dict:
    """The fenced block right after python block ``key``."""
    index = next(i for i, b in enumerate(BLOCKS) if b.get("key") == key)
    return BLOCKS[index + 1]


def _exec(code: str, ns: dict, line: int = 1) -> dict:
    """Run ``code`` in ``ns`` with README line numbers in tracebacks; the values of top-level expression
    statements (``out.token_ids``) are kept in ``ns["_values"]``, in order."""
    tree = ast.parse(code)
    for k, node in enumerate(tree.body):
        if isinstance(node, ast.Expr):
            call = ast.Call(ast.Attribute(ast.Name("_values", ast.Load()), "append", ast.Load()), [node.value], [])
            tree.body[k] = ast.copy_location(ast.Expr(call), node)
    ast.fix_missing_locations(tree)
    ast.increment_lineno(tree, line - 1)
    ns.setdefault("_values", [])
    ns.setdefault("__name__", "readme_example")
    exec(compile(tree, README, "exec"), ns)
    return ns


def _instrument(code: str, before: str, insert: str) -> str:
    """``insert`` as a statement just before the statement starting the line that holds ``before`` (which must
    occur once), on that line: README line numbers stay right."""
    assert code.count(before) == 1, f"the README block no longer holds {before!r}"
    at = code.index(before)
    at = code.rindex("\n", 0, at) + 1
    return code[:at] + insert + "; " + code[at:]


# ------------------------------------------------------------------------------------------- helpers


def _tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).eval()


def _check_chain(out, target_probs, draft_token_ids, num_draft_tokens, greedy=None):
    """rejection_sample's output as the comments state it: int64 [B, K+1] tokens (accepted drafts, one more
    token, then -1), int32 [B] num_accepted <= n_b; a greedy request emits the argmax at its stop."""
    B, K = draft_token_ids.shape
    V = target_probs.shape[-1]
    assert out.token_ids.dtype == torch.int64 and out.token_ids.shape == (B, K + 1)
    assert out.num_accepted.dtype == torch.int32 and out.num_accepted.shape == (B,)
    for b in range(B):
        na = int(out.num_accepted[b])
        assert 0 <= na <= int(num_draft_tokens[b])
        row = out.token_ids[b]
        assert torch.equal(row[:na], draft_token_ids[b, :na])
        assert 0 <= int(row[na]) < V
        assert (row[na + 1:] == -1).all()
        if greedy is not None and bool(greedy[b]):
            assert int(row[na]) == int(target_probs[b, na].float().argmax())


# ------------------------------------------------------------------------------------- per-block setup


def _setup_python_api(ns):
    ns["target_model"] = ns["model"] = _tiny_llama()
    ns["tokenizer"] = None
    ns["prompts"] = [[5, 17, 23, 42, 5, 17, 23, 8, 61, 5, 17], [3], [70, 71, 72, 73, 70, 71]]


def _check_python_api_1(ns):
    out, target, prompts = ns["out"], ns["target_model"], ns["prompts"]
    assert isinstance(out.sequences, list) and len(out.sequences) == len(prompts)
    for prompt, seq in zip(prompts, out.sequences):  # greedy: the target's own generate(), token for token
        ids = torch.tensor([prompt])
        ref = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=128, do_sample=False,
                              pad_token_id=0)[0, len(prompt):].tolist()
        assert seq == ref
    for name in ("target_forwards", "draft_tokens", "accepted_tokens", "mean_accepted_length", "tokens_per_second"):
        assert isinstance(getattr(out.stats, name), (int, float)), name
    assert out.logprobs is None
    again = ns["decoder"].generate(prompts, max_new_tokens=8, logprobs=True)   # "with logprobs=True: ..."
    assert [len(lp) for lp in again.logprobs] == [len(s) for s in again.sequences]
    assert all(isinstance(v, float) and v <= 0 for lp in again.logprobs for v in lp)


def _check_python_api_2(ns):
    from specdec_ops.decoding import ByMatchLength, CopyCursor, CostModel, FixedLength, default_setup

    classic, by_length, default_like = ns["_values"]
    assert (classic.n, classic.k) == (3, None) and isinstance(classic.length, FixedLength)
    assert isinstance(by_length.length, ByMatchLength)
    # "draft length by match size (1, 2, 3+ tokens)": 0, 16, 32, and 32 for longer matches
    assert by_length.length.lengths(None, [1, 2, 3, 9], [99] * 4, 99) == [0, 16, 32, 32]
    setup = default_setup(ns["model"])   # "what default_setup builds (k = 32)"
    assert setup["num_speculative_tokens"] == 32 and setup["tree"] is None
    built = setup["drafter"]
    for drafter in (default_like, built):
        assert drafter.n == 32 and isinstance(drafter.length, CostModel)
        assert [type(r) for r in drafter.rerank] == [CopyCursor] and drafter.rerank[0].window == 8
    assert default_like.length.optimism == built.length.optimism == 0.0


def _check_chain_1(ns):
    _check_chain(ns["out"], ns["target_probs"], ns["draft_token_ids"], ns["num_draft_tokens"],
                 greedy=torch.tensor([False, False, True, False]))


def _check_chain_2(ns):
    out, cu, K = ns["out"], ns["cu"], ns["K"]
    B = cu.numel() - 1
    assert out.token_ids.dtype == torch.int64 and out.token_ids.shape == (B, K + 1)   # max_num_draft_tokens=K
    assert (out.num_accepted <= cu.diff()).all()
    # "Padded and packed forms give identical results for the same requests and seeds": the padded block's
    # requests, packed
    p, d, q, n = ns["target_probs"], ns["draft_token_ids"], ns["draft_probs"], ns["num_draft_tokens"]
    greedy = torch.tensor([False, False, True, False])
    common = dict(seeds=torch.arange(B), offsets=torch.zeros(B, dtype=torch.int64), greedy=greedy)
    padded = specdec_ops.rejection_sample(p, d, n, q, **common)
    cu_n = torch.cat([torch.zeros(1, dtype=torch.int64), n.cumsum(0)])
    packed = specdec_ops.rejection_sample_packed(
        torch.cat([p[b, :int(n[b]) + 1] for b in range(B)]), cu_n, torch.cat([d[b, :int(n[b])] for b in range(B)]),
        torch.cat([q[b, :int(n[b])] for b in range(B)]), max_num_draft_tokens=K, **common)
    assert torch.equal(packed.token_ids, padded.token_ids) and torch.equal(packed.num_accepted, padded.num_accepted)


def _check_tree_verification(ns):
    out, parents, tree_token_ids = ns["out"], ns["parents"], ns["tree_token_ids"]
    B, N = parents.shape
    assert out.token_ids.dtype == torch.int64 and out.token_ids.shape == (B, N)
    assert out.accepted_path.dtype == torch.int32 and out.accepted_path.shape == (B, N)
    assert out.num_accepted.dtype == torch.int32 and out.num_accepted.shape == (B,)
    for b in range(B):
        k = int(out.num_accepted[b])
        path = out.accepted_path[b].tolist()
        assert path[0] == 0 and all(parents[b, path[i]] == path[i - 1] for i in range(1, k + 1))
        assert path[k + 1:] == [-1] * (N - k - 1)
        assert out.token_ids[b, :k].tolist() == tree_token_ids[b, path[1:k + 1]].tolist()
        assert 0 <= int(out.token_ids[b, k]) < ns["target_probs"].shape[-1]
        assert (out.token_ids[b, k + 1:] == -1).all()
    other_root = tree_token_ids.clone()
    other_root[:, 0] = 31999                               # "entry 0 is ignored"
    again = specdec_ops.tree_rejection_sample(ns["target_probs"], other_root, parents, None, ns["draft_probs"],
                                              seeds=torch.tensor([1234]), offsets=torch.tensor([0]))
    assert torch.equal(again.token_ids, out.token_ids) and torch.equal(again.accepted_path, out.accepted_path)


def _check_logits(ns):
    out, logits, B, K, V = ns["out"], ns["logits"], ns["B"], ns["K"], ns["V"]
    _check_chain(out, logits, ns["draft_token_ids"], ns["num_draft_tokens"], greedy=ns["temperature"] == 0)
    assert out.logprobs.dtype == torch.float32 and out.logprobs.shape == (B, K + 1)
    for b in range(B):
        na = int(out.num_accepted[b])
        assert torch.isfinite(out.logprobs[b, :na + 1]).all() and torch.isnan(out.logprobs[b, na + 1:]).all()
    na = int(out.num_accepted[0])   # request 0 is greedy: log_softmax of the raw logits
    expected = torch.log_softmax(logits[0, na].float(), -1)[out.token_ids[0, na]]
    torch.testing.assert_close(out.logprobs[0, na], expected, rtol=1e-4, atol=1e-4)
    probs = ns["probs"]
    assert probs.dtype == torch.float32 and probs.shape == (B, K + 1, V)
    # "rejection_sample_logits(l, ...) equals rejection_sample(process_logits(l, ...), ..., greedy=temperature == 0)"
    ref = specdec_ops.rejection_sample(probs, ns["draft_token_ids"], ns["num_draft_tokens"],
                                       seeds=torch.tensor([11, 12, 13]), offsets=torch.zeros(B, dtype=torch.int64),
                                       greedy=ns["temperature"] == 0)
    assert torch.equal(ref.token_ids, out.token_ids)
    # the commented signatures
    names = list(inspect.signature(specdec_ops.rejection_sample_logits_packed).parameters)
    assert names[1:3] == ["cu_num_draft_tokens", "draft_token_ids"]
    names = list(inspect.signature(specdec_ops.tree_rejection_sample_logits).parameters)
    assert names[1:4] == ["tree_token_ids", "parents", "num_nodes"]


def _check_tree_masks(ns):
    info, parents, num_nodes = ns["info"], ns["parents"], ns["num_nodes"]
    B, N = parents.shape
    assert info.mask.dtype == torch.int64 and info.mask.shape == (B, N, (N + 63) // 64)
    assert info.depth.dtype == torch.int32 and info.depth.shape == (B, N)
    for b in range(B):
        for i in range(N):
            word = int(info.mask[b, i, 0])
            if i >= int(num_nodes[b]):
                assert word == 0 and int(info.depth[b, i]) == -1
                continue
            line, j = {i}, i
            while parents[b, j] >= 0:
                j = int(parents[b, j])
                line.add(j)
            assert {t for t in range(N) if word >> t & 1} == line
            assert int(info.depth[b, i]) == len(line) - 1
    assert torch.equal(ns["positions"], ns["prefix_lens"][:, None] + info.depth)


def _setup_linear(ns):
    ns.update(x=torch.randn(2, 3, 64), weight=torch.randn(48, 64), bias=torch.randn(48))


def _check_linear(ns):
    from specdec_ops.linear import ISAS, skinny_linear_isa

    out = ns["out"]
    assert out.shape == (2, 3, 48) and out.dtype == torch.float32
    torch.testing.assert_close(out, torch.nn.functional.linear(ns["x"], ns["weight"], ns["bias"]), rtol=1e-5, atol=1e-4)
    assert skinny_linear_isa() in ISAS


def _setup_hf(ns):
    from transformers import DynamicCache

    from specdec_ops.decoding.forward import cache_kwarg

    model = _tiny_llama()
    B, N = ns["parents"].shape
    prefix = torch.randint(0, 100, (B, 10))
    cache = DynamicCache()
    with torch.no_grad():
        model(prefix, **{cache_kwarg(model): cache})
    ns.update(model=model, cache=cache, prefix=prefix, prefix_lens=torch.tensor([10] * B),
              tree_token_ids=torch.randint(0, 100, (B, N)))


def _check_hf(ns):
    out, model, info, num_nodes, parents = ns["out"], ns["model"], ns["info"], ns["num_nodes"], ns["parents"]
    B, N = parents.shape
    assert out.logits.shape == (B, N, 100)
    with torch.no_grad():   # node i's logits are a plain causal forward over the prefix and i's root-to-node line
        for b in range(B):
            for i in range(int(num_nodes[b])):
                line, j = [i], i
                while parents[b, j] >= 0:
                    j = int(parents[b, j])
                    line.insert(0, j)
                seq = torch.cat([ns["prefix"][b], ns["tree_token_ids"][b, line]])[None]
                torch.testing.assert_close(out.logits[b, i], model(seq).logits[0, -1], rtol=1e-4, atol=1e-5)


KV_SNAPSHOT = "__old__ = ([c.clone() for c in k_caches + v_caches], seq_lens.clone())"


def _check_kv_commit(ns):
    old_caches, old_lens = ns["__old__"]
    caches, path, seq_lens = ns["k_caches"] + ns["v_caches"], ns["out"].accepted_path, ns["seq_lens"]
    assert torch.equal(seq_lens, old_lens + (path >= 0).sum(1).int())
    for old, new in zip(old_caches, caches):
        for b in range(path.shape[0]):
            p = path[b][path[b] >= 0].long()
            start = int(old_lens[b])
            assert torch.equal(new[b, start:start + len(p)], old[b, start + p])
    # the comment's example: path [0, 2, 4, 5, -1, -1] moves slots 11, 12, 13 <- 12, 14, 15; seq_lens[0] -> 14
    example = [c.clone() for c in old_caches]
    lens = old_lens.clone()
    specdec_ops.kv_commit(example, lens, torch.tensor([[0, 2, 4, 5, -1, -1], [0, -1, -1, -1, -1, -1]]))
    assert int(lens[0]) == 14 and int(old_lens[0]) == 10
    for old, new in zip(old_caches, example):
        assert torch.equal(new[0, [11, 12, 13]], old[0, [12, 14, 15]])
    # the commented HF-layout call on [B, H, S, D] tensors gives the same caches
    code = ns["__block__"]
    call = "\n".join(line.strip()[2:] for line in code[code.index("# specdec_ops.kv_commit("):].splitlines())
    layers = len(ns["k_caches"])
    hf = {"hf_keys": [c.transpose(1, 2).contiguous() for c in old_caches[:layers]],
          "hf_values": [c.transpose(1, 2).contiguous() for c in old_caches[layers:]],
          "seq_lens": old_lens.clone(), "out": ns["out"], "specdec_ops": specdec_ops}
    exec(call, hf)
    assert torch.equal(hf["seq_lens"], seq_lens)
    for hf_cache, cache in zip(hf["hf_keys"] + hf["hf_values"], caches):
        assert torch.equal(hf_cache.transpose(1, 2), cache)


def _check_engine(ns):
    assert ns["__stdout__"].startswith("chain: [[")


# ------------------------------------------------------------------------------------------- the lists


RUN = {
    "python-api-1": dict(setup=_setup_python_api, check=_check_python_api_1),
    "python-api-2": dict(setup=_setup_python_api, check=_check_python_api_2),
    "chain-rejection-sampling-1": dict(check=_check_chain_1),
    "chain-rejection-sampling-2": dict(after="chain-rejection-sampling-1", check=_check_chain_2),
    "tree-verification-tree-rejection-sample": dict(check=_check_tree_verification),
    "verification-from-logits": dict(check=_check_logits),
    "tree-attention-masks": dict(check=_check_tree_masks),
    "hugging-face-models": dict(after="tree-attention-masks", setup=_setup_hf, check=_check_hf),
    "kv-commit-in-place-pointer-rollback-kv-commit-2": dict(
        instrument=("specdec_ops.kv_commit(k_caches + v_caches", KV_SNAPSHOT), check=_check_kv_commit),
    "few-row-linear-products-on-the-cpu-skinny-linear": dict(setup=_setup_linear, check=_check_linear),
    "using-the-ops-in-your-engine": dict(check=_check_engine),
    "tensor-parallel-verification-specdec-ops-distributed": dict(torchrun=True),
}

SKIP = {
    "kv-commit-in-place-pointer-rollback-kv-commit-1":
        "pseudo-code: the signatures of kv_commit and kv_rollback (`*,` in a call, `-> None`); "
        "test_kv_commit_signature_block checks the parameter names instead",
}


def _run(key: str) -> dict:
    spec, block = RUN[key], PYTHON[key]
    ns = _run(spec["after"]) if "after" in spec else {}
    if "setup" in spec:
        spec["setup"](ns)
    code = block["code"]
    if "instrument" in spec:
        code = _instrument(code, *spec["instrument"])
    ns["__block__"] = code
    torch.manual_seed(0)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`past_key_values` is deprecated", category=FutureWarning)
        _exec(code, ns, block["line"])
    ns["__stdout__"] = stdout.getvalue()
    return ns




def test_every_python_block_is_run_or_skipped():
    keys = list(PYTHON)
    assert len(keys) == len(set(keys)), "two python blocks share a key"
    missing = [k for k in keys if k not in RUN and k not in SKIP]
    assert not missing, f"README python blocks neither run nor listed in SKIP (with a reason): {missing}"
    assert not set(RUN) & set(SKIP)
    stale = [k for k in list(RUN) + list(SKIP) if k not in PYTHON]
    assert not stale, f"entries for python blocks README.md no longer has: {stale}"


@pytest.mark.parametrize("key", list(PYTHON))
def test_readme_python_block(key, tmp_path):
    if key in SKIP:
        pytest.skip(SKIP[key])
    if key not in RUN:
        pytest.fail(f"{key}: neither run nor skipped")
    if RUN[key].get("torchrun"):
        _run_torchrun(key, tmp_path)
        return
    ns = _run(key)
    RUN[key]["check"](ns)


def _run_torchrun(key, tmp_path):
    """Run the block as its first line says (torchrun, N ranks, gloo on CPU); its stdout must be the output
    block README.md shows after it."""
    code = PYTHON[key]["code"]
    first = code.splitlines()[0]
    m = re.match(r"# (\w+\.py): run with\s+torchrun --nproc-per-node (\d+) \1$", first)
    assert m, first
    (tmp_path / m.group(1)).write_text(code)
    shown = _after(key)
    assert shown["lang"] == "", "the block's output should follow it"
    shown_lines = shown["code"].strip("\n").splitlines()
    assert shown_lines[0] == f"$ PYTHONPATH=$PWD torchrun --nproc-per-node {m.group(2)} {m.group(1)}"
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           m.group(2), m.group(1)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip("\n").splitlines() == shown_lines[1:]


# ------------------------------------------------------------------------------------- beyond the blocks


def test_kv_commit_signature_block():
    """The skipped pseudo-signatures name each function's parameters, in order, keyword-only after `*`."""
    code = re.sub(r"#.*", "", PYTHON["kv-commit-in-place-pointer-rollback-kv-commit-1"]["code"])
    found = re.findall(r"specdec_ops\.(\w+)\((.*?)\)\s*->\s*None", code, re.S)
    assert [name for name, _ in found] == ["kv_commit", "kv_rollback"]
    for name, args in found:
        params = inspect.signature(getattr(specdec_ops, name)).parameters
        shown, keyword_only = [], False
        for arg in (a.strip() for a in args.split(",") if a.strip()):
            if arg == "*":
                keyword_only = True
                continue
            arg_name = re.match(r"\w+", arg).group(0)
            kind = inspect.Parameter.KEYWORD_ONLY if keyword_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
            assert params[arg_name].kind == kind, (name, arg_name)
            if "=" in arg:
                assert repr(params[arg_name].default) == arg.split("=", 1)[1].strip(), (name, arg_name)
            shown.append(arg_name)
        assert shown == list(params), name


def test_cli_flag_table_lists_the_generate_options():
    from specdec_ops.__main__ import build_parser

    text = open(README, encoding="utf-8").read()
    section = text[text.index("### Try it"):text.index("### Python API")]
    rows = [line for line in section.splitlines() if line.startswith("| `--")]
    listed = {flag for row in rows for flag in re.findall(r"--[a-z][-a-z]*", row.split(" | ")[0])}
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["generate"]
    options = {s for a in sub._actions for s in a.option_strings if s.startswith("--")} - {"--help"}
    assert listed == options


def test_bench_commands_use_existing_flags():
    """Every --flag of a `python bench/X.py ...` command in the text is one that script (or bench/common.py,
    whose parsers the scripts share) defines (checked with --help once; statically here)."""
    text = re.sub(r"\s+", " ", open(README, encoding="utf-8").read())
    common = open(os.path.join(ROOT, "bench", "common.py"), encoding="utf-8").read()
    checked = 0
    for m in re.finditer(r"python (bench/\w+\.py)((?: \[?--[a-z][-a-z0-9]*(?:[ =][^\s\]`-][^\s\]`]*)?\]?| \.\.\.)*)",
                         text):
        source = open(os.path.join(ROOT, m.group(1)), encoding="utf-8").read()
        for flag in re.findall(r"--[a-z][-a-z0-9]*", m.group(2)):
            assert f'"{flag}"' in source + common, (m.group(0), flag)
            checked += 1
    assert checked >= 20
