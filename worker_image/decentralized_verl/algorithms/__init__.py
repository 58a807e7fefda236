"""RL algorithms: the functions behind the names a spec gives (`registry`). Importing the package stays
torch-free: the torch functions live in submodules; the names and presets are the spec's catalogue's
(`spec/catalogue/algorithms.py`)."""
