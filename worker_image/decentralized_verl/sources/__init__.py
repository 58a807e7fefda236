"""Model and data sources: the pure path rules (paths.py), the fetcher an init container runs
(`python -m decentralized_verl.sources.fetch`) and `dverl run`'s mapping of pod paths to local folders
(local.py)."""
