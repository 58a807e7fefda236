"""The coordinator's Status RPC: the operator and `dverl run` read the job's progress from here."""

from __future__ import annotations

from decentralized_verl.core.status import StatusBoard
from decentralized_verl.proto import dverl_pb2_grpc
from decentralized_verl.transport import messages


class CoordinatorServicer(dverl_pb2_grpc.CoordinatorServicer):
    def __init__(self, board: StatusBoard) -> None:
        self.board = board

    async def Status(self, request, context):
        return messages.job_status_to_proto(self.board.current)
