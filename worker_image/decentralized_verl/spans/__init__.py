"""Serving one policy as a chain of layer spans: each span server holds decoder layers [a, b) and the KV
cache of each session; the front (embeddings, final norm, LM head, sampling) sends hidden states through
the chain, routes sessions by id and replays a session's prefix into a replacement when a span dies.

- `layout`: which layers each span holds, and how full-model tensor names map to a span's (pure);
- `blocks`: the torch modules a span server and the front compute with, built from a model spec;
- `codec`: the wire format of one hop (tensors plus a few fields, one safetensors blob);
- `server`: a span server process (gRPC), its sessions and their timeouts;
- `client` / `chain`: one hop's client, and a session through the whole chain with failover;
- `backend`: the front as a `GenerationBackend`, sampling exactly as the single-process HF backend does;
- `signed`: per-span weight manifests the learner signs, so a span server trusts its layers, not the front;
- volunteers serving spans: `p2p` (the span service over Hivemind streams), `volunteer` (a volunteer's
  process), `front_volunteers` (a front taking them as untrusted replicas) and `roster` (the coordinator
  assigning their spans and blocking the ones a front caught cheating).

A package of its own, one layer above the serving roles and the volunteers: it uses the volunteers' DHT
and announcements, and neither imports it.
"""
