"""The process runtime: cores, threads, memory, ports, signals and child processes of one worker process.

Every layer above `core/` may use it; it imports nothing of the runtime's own but `settings`, so the
operator can read `lifecycle.CALL_GRACE_S` without pulling in torch.
"""
