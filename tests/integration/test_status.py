"""The one Status type: the coordinator's board, the Status RPC, and both readers (the operator and
`dverl run`), which validate every reply and read a malformed one as "no progress".

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from decentralized_verl.core.status import RefitParity, StatusBoard
from decentralized_verl.launch.run import coordinator_status
from decentralized_verl.orchestration.status_service import CoordinatorServicer
from decentralized_verl.proto import dverl_pb2, dverl_pb2_grpc
from decentralized_verl.serving.servicers import serve
from dverl_operator.jobs.coordinator import CoordinatorClient


class _Replying(dverl_pb2_grpc.CoordinatorServicer):
    def __init__(self, reply: dverl_pb2.JobStatus) -> None:
        self.reply = reply

    async def Status(self, request, context):
        return self.reply


async def test_both_readers_get_the_board_back_over_a_real_status_rpc() -> None:
    board = StatusBoard()
    board.update(step=4, total_steps=9, state="Running", phase="update", reward_mean=0.75, volunteers=2)
    board.update(
        policy_version=4, refit_parity=RefitParity(diff_mean=3e-7, diff_max=2e-6, version=3, tokens=48)
    )
    board.block("peer-x", "verification failed")
    server = await serve(0, CoordinatorServicer(board))
    address = f"127.0.0.1:{server.port}"
    try:
        client = CoordinatorClient(template=address)
        got = await client.progress("j", "ns", None)
        assert got == board.current and got is not None
        assert got.refit_parity == RefitParity(diff_mean=3e-7, diff_max=2e-6, version=3, tokens=48)
        assert await asyncio.to_thread(coordinator_status, address) == board.current
        await client.close()
    finally:
        await server.stop(None)


@pytest.mark.parametrize(
    "reply",
    [
        dverl_pb2.JobStatus(step=3, total_steps=10, state="Running", reward_mean=math.nan),
        dverl_pb2.JobStatus(step=11, total_steps=10, state="Running"),
        dverl_pb2.JobStatus(step=3, total_steps=10, state=""),
        dverl_pb2.JobStatus(step=3, total_steps=10, state="Running", eval_accuracy=1.5),
        dverl_pb2.JobStatus(
            step=3,
            total_steps=10,
            state="Running",
            policy_version=3,
            refit_parity=dverl_pb2.RefitParity(diff_mean=-1.0, diff_max=1.0, version=2),
        ),
    ],
)
async def test_a_malformed_status_reply_is_no_progress_for_either_reader(reply) -> None:
    server = await serve(0, _Replying(reply))
    address = f"127.0.0.1:{server.port}"
    try:
        client = CoordinatorClient(template=address)
        assert await client.progress("j", "ns", None) is None
        assert await asyncio.to_thread(coordinator_status, address) is None
        await client.close()
    finally:
        await server.stop(None)
