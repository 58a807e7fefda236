"""Model loading, the tiny test model, LoRA, checkpoints and log-probs.

Submodules import torch/transformers, so this package file imports nothing heavy; import from
`decentralized_verl.models.loading`, `.checkpoint`, `.lora`, `.logprobs`, `.tokenizer`, `.tiny`.
"""
