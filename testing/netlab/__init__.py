"""Hosts on emulated networks: network namespaces with their own addresses, shaped links, partitions.

Test and benchmark tooling, not part of the installed package: tests find it through pytest's
`pythonpath` (pyproject.toml), benchmarks put `testing/` on `sys.path` themselves."""
