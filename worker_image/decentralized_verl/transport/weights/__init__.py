"""Weights from the learner to every rollout worker and volunteer, in one package.

`codec` (a state dict <-> versioned chunks, hashed with `transport.digest`), `stream` (encoding a sharded
learner's gathered tensors), `signing` (manifests signed by the learner), `publish` (the learner's publisher
and the Weights service) and `receive` (chunks checked as they arrive, the pullers), `delta` and
`delta_publish` (versions as differences; `transport.delta_p2p` carries them between peers), the fan-out
(`route`: who forwards to whom; `relay`: a rollout worker's relay, with `node` what its parts see of it;
`push`: one version down a route; `fanout`: the learner's and a worker's ends), and the bulk plane
(`bulk_plane`, `bulk_send`, `bulk_wire`: the bytes over plain TCP or TLS).
"""
