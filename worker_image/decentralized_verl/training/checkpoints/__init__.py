"""Checkpoints, in one home: `folders` (the Hugging Face folder any stage, worker or tool loads, written
under a temporary name and renamed, its sha256 manifest last), `learner` (the learner's own: when one is
due, taken without stopping training, resumed from the newest that checks out) and `sharded` (FSDP2
learners' torch.distributed.checkpoint shards, resumable at another learner count)."""
