"""RL algorithms. Importing the package stays torch-free: the torch functions live in submodules."""

from decentralized_verl.algorithms.presets import PRESETS, AlgorithmPreset

__all__ = ["PRESETS", "AlgorithmPreset"]
