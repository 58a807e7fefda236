"""Volunteers: machines outside the cluster that join a job through its Hivemind DHT.

Submodules import hivemind and torch only when used; this package's import stays light.
"""
