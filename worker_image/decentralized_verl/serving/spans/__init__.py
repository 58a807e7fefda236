"""Serving one policy as a chain of layer spans: each span server holds decoder layers [a, b) and the KV
cache of each session; the front (embeddings, final norm, LM head, sampling) sends hidden states through
the chain, routes sessions by id and replays a session's prefix into a replacement when a span dies.

- `layout`: which layers each span holds, and how full-model tensor names map to a span's (pure);
- `blocks`: the torch modules a span server and the front compute with, built from a model spec;
- `codec`: the wire format of one hop (tensors plus a few fields, one safetensors blob);
- `server`: a span server process (gRPC), its sessions and their timeouts;
- `client` / `chain`: one hop's client, and a session through the whole chain with failover;
- `backend`: the front as a `GenerationBackend`, sampling exactly as the single-process HF backend does.
"""
