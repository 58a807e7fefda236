"""Model and data sources at run time: the fetcher an init container runs
(`python -m decentralized_verl.sources.fetch`) and `dverl run`'s mapping of pod paths to local folders
(local.py). What a source means and where it may mount is the spec's (`spec/source_paths.py`,
`spec/uri.py`, `spec/source_rules.py`)."""
