"""The vLLM backend's weight export (LoRA merging, alias removal) and its missing-engine message, which run
everywhere; the engine's own tests, which need vLLM, are in tests/integration/test_backend_vllm.py."""

from __future__ import annotations

import copy

import pytest
import torch

from decentralized_verl.backends.vllm_weights import export_state_dict, write_weights_file
from tests.support import vllm_fixtures


def tiny_tied_model(seed: int = 0) -> tuple[torch.nn.Module, object]:
    """A 2-layer Llama with tied embeddings (like SmolLM2), head size 64 (a size vLLM's CPU kernels have)."""
    return vllm_fixtures.tiny_tied_model(
        hidden_size=128, num_layers=2, intermediate_size=256, max_positions=256, seed=seed
    )


# ------------------------------------------------------------------ export (no vLLM needed)


def test_export_drops_tied_alias_and_keeps_everything_else() -> None:
    model, _ = tiny_tied_model()
    exported = export_state_dict(model)
    assert "lm_head.weight" not in exported  # alias of the embedding: the engine re-ties it
    assert set(exported) == set(model.state_dict()) - {"lm_head.weight"}
    for name, tensor in exported.items():
        assert torch.equal(tensor, model.state_dict()[name])
        assert tensor.is_contiguous()


def test_export_of_lora_model_equals_peft_merge_and_unload(tmp_path) -> None:
    import peft

    model, _ = tiny_tied_model()
    lora = peft.get_peft_model(
        copy.deepcopy(model), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    with torch.no_grad():  # B = 0 at init: give the adapters real values so the merge matters
        for name, param in lora.named_parameters():
            if "lora_" in name:
                param.normal_(0, 0.3)
    exported = export_state_dict(lora)
    expected = {
        k: v for k, v in copy.deepcopy(lora).merge_and_unload().state_dict().items() if k != "lm_head.weight"
    }
    assert set(exported) == set(expected)
    for name in expected:
        torch.testing.assert_close(exported[name], expected[name], rtol=0, atol=1e-6)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(exported[q], model.state_dict()[q])  # the adapter really was merged

    path = write_weights_file(exported, tmp_path)  # the file the engine reads: same tensors back
    from safetensors.torch import load_file

    assert set(load_file(str(path))) == set(exported)


# ------------------------------------------------------------------ registration and benchmark smoke


def test_vllm_is_registered_and_says_how_to_install_when_missing() -> None:
    from decentralized_verl.backends.factory import ENGINES, make_backend
    from decentralized_verl.spec.catalogue.backends import VLLM

    assert ENGINES[VLLM] == "decentralized_verl.backends.vllm_backend:VLLMBackend"
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vLLM is installed here: the missing-engine message cannot be seen")
    model, tokenizer = tiny_tied_model()
    with pytest.raises(ImportError, match=r"'vllm' is not installed.*install-vllm\.sh"):
        make_backend(VLLM, model, tokenizer)
