"""Hosts on emulated networks: network namespaces with their own addresses, shaped links, partitions."""
