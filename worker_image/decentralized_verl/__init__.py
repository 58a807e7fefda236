"""Decentralized veRL: RL fine-tuning runtime (workers, volunteers and `dverl run`)."""

__version__ = "0.1.0"
