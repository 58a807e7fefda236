"""Real processes, servers, DHT peers and network namespaces, each test short."""
