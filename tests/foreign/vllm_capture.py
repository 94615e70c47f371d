"""Hidden states the vLLM way (run in .venv-vllm, scripts/vllm_audit.sh): vLLM's CPU build with
the extract_hidden_states speculative method writes hs_{i}.safetensors for each prompt.

    python vllm_capture.py MODEL_DIR PROMPTS.json OUT_DIR DTYPE LAYER_IDS

LAYER_IDS are vLLM's (hidden-state indices: 0 the embedding, L the last layer's output)."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from safetensors.torch import save_file  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (  # noqa: E402,E501
    cleanup_hidden_states, load_hidden_states)


def main() -> None:
    model, prompts_path, out, dtype, layers = sys.argv[1:6]
    prompts = json.loads(Path(prompts_path).read_text())
    ids = [int(x) for x in layers.split(",")]
    staging = Path(out) / "staging"
    staging.mkdir(parents=True, exist_ok=True)
    llm = LLM(model=model, dtype=dtype, enforce_eager=True, max_model_len=1024,
              speculative_config={"method": "extract_hidden_states",
                                  "num_speculative_tokens": 1,
                                  "draft_model_config": {"hf_config": {
                                      "eagle_aux_hidden_state_layer_ids": ids}}},
              kv_transfer_config={"kv_connector": "CpuHiddenStatesConnector",
                                  "kv_connector_module_path": "vllm_cpu_connector",
                                  "kv_role": "kv_producer",
                                  "kv_connector_extra_config": {
                                      "shared_storage_path": str(staging)}})
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                           SamplingParams(max_tokens=1, temperature=0.0))
    for i, o in enumerate(outputs):
        path = (o.kv_transfer_params or {}).get("hidden_states_path")
        if not path:
            raise SystemExit(f"prompt {i}: vLLM returned no hidden_states_path")
        # vLLM's own reader: it waits on the file's lock until the engine has written it.
        save_file(load_hidden_states(path), str(Path(out) / f"hs_{i}.safetensors"))
        cleanup_hidden_states(path)
    shutil.rmtree(staging, ignore_errors=True)
    print(json.dumps({"files": len(outputs), "layer_ids": ids, "dtype": dtype}))


if __name__ == "__main__":
    main()
