"""Volunteers: machines outside the cluster that join a job through its Hivemind DHT.

hivemind is imported only by what joins a DHT (`dht.start_dht`, the P2P calls); this package's own import
stays light.
"""
