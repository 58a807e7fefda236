"""The coordinator's Status RPC: the operator and `dverl run` read progress from here."""

from __future__ import annotations

from decentralized_verl.proto import dverl_pb2, dverl_pb2_grpc
from decentralized_verl.roles.progress import ProgressState
from decentralized_verl.transport import messages


def status_message(progress: ProgressState) -> dverl_pb2.JobStatus:
    return messages.job_status_to_proto(
        messages.JobStatus(
            step=progress.step,
            total_steps=progress.total_steps,
            phase=progress.phase,
            state=progress.state,
            reward_mean=progress.reward_mean,
            reward_std=progress.reward_std,
            kl=progress.kl,
            response_length_mean=progress.response_length_mean,
            policy_version=progress.policy_version,
            tokens_per_second=progress.tokens_per_second,
            phase_seconds=tuple(sorted(progress.phase_seconds.items())),
            last_checkpoint=progress.last_checkpoint,
            eval_accuracy=progress.eval_accuracy,
            volunteers=progress.volunteers,
            blocked_peers=tuple(progress.blocked_peers.items()),
        )
    )


class CoordinatorServicer(dverl_pb2_grpc.CoordinatorServicer):
    def __init__(self, progress: ProgressState) -> None:
        self.progress = progress

    async def Status(self, request, context):
        return status_message(self.progress)
