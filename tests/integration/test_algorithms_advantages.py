"""Advantage estimators against slow per-sample loop references, hand-worked numbers, and leak checks.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations


def test_registry_and_catalogue_import_without_torch():
    """The spec and the operator read names and presets from the catalogue, and the registry's tables
    fill only when load() imports the torch modules."""
    import subprocess
    import sys

    code = (
        "import sys; import decentralized_verl.algorithms.registry, "
        "decentralized_verl.spec.catalogue.algorithms; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
