"""Put on PYTHONPATH, this makes every rollout worker of a job load a corrupted refresh: from policy
version 1 on, each floating tensor it is sent is loaded with noise added, as a broken weight path would
(a wrong cast, a tensor of the wrong layer). Nothing else changes: the learner, the wire, the signed
manifest and every check before the copy see the true weights. Processes of other roles import nothing
here."""

import os

if os.environ.get("DVERL_ROLE") == "rollout":
    import torch

    from decentralized_verl.backends.hf import HFBackend

    _load = HFBackend.load_weights

    def _corrupted(self, state_dict, version, *, partial=False):
        if version >= 1:
            noise = torch.Generator().manual_seed(version)
            state_dict = {
                name: t + 0.5 * torch.randn(t.shape, generator=noise, dtype=torch.float32).to(t.dtype)
                if t.is_floating_point()
                else t
                for name, t in state_dict.items()
            }
        return _load(self, state_dict, version, partial=partial)

    HFBackend.load_weights = _corrupted
