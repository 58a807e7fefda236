"""`dverl train --stage sft|reward|rlhf|all`: supervised fine-tuning, reward-model training, then RL.

Each stage saves a Hugging Face checkpoint that the next one loads. Submodules import torch; this
file imports nothing heavy. Entry point: `decentralized_verl.stages.runner.run_stage`.
"""
