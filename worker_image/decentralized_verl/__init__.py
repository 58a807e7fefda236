"""Decentralized veRL: RL fine-tuning runtime (workers, volunteers and `dverl run`)."""

__version__ = "0.1.0"

_API = {
    "Algorithm",
    "AlgorithmConfig",
    "DecentralizedConfig",
    "DecentralizedTrainer",
    "ModelConfig",
    "NetworkConfig",
    "TrainingConfig",
}


def __getattr__(name: str):
    """The Python API (`from decentralized_verl import DecentralizedTrainer`), imported on first use so
    that importing the package stays light for the operator."""
    if name in _API:
        from decentralized_verl import api  # noqa: PLC0415 light: `import decentralized_verl` loads no torch (the operator imports the package)

        return getattr(api, name)
    raise AttributeError(f"module 'decentralized_verl' has no attribute {name!r}")
