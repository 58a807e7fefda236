"""Creates the API server refuses become the job's status: the real operator against the emulator,
whose pod creates answer as Pod Security admission does until the namespace lets them through. The job
says why in a condition, an Event and its message, the operator backs off exponentially instead of
asking every pass, and once the refusal ends the pods are made and the condition goes."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import aiohttp.web
import kmock
import pytest
from kmock._internal import enums

from dverl_operator.status import conditions as cond
from tests.support.operator_fixtures import Emulator, Operator, tiny_spec, wait_for

pytestmark = pytest.mark.timeout(240)
SAYS = (
    'pods "{name}" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false '
    '(container "worker" must set securityContext.allowPrivilegeEscalation=false)'
)


class AdmittingEmulator(kmock.KubernetesEmulator):
    """The emulator behind an admission stage that refuses every pod create while `refusing`, before
    anything is stored (kmock's own reactions answer after it has stored the object)."""

    refusing = True

    async def _handle(self, request: Any) -> aiohttp.web.StreamResponse:
        resource = request.resource
        if self.refusing and request.action == enums.action.CREATE and resource and resource.plural == "pods":
            name = ((request.data or {}).get("metadata") or {}).get("name")
            body = {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403}
            return aiohttp.web.json_response({**body, "message": SAYS.format(name=name)}, status=403)
        return await super()._handle(request)


async def refused_condition(emu: Emulator, job: str, attempt: int) -> dict[str, Any] | None:
    status = ((await emu.job(job)) or {}).get("status") or {}
    found = cond.condition(status.get("conditions") or [], cond.CREATE_REFUSED)
    if found is None:
        return None
    seen = re.search(r"attempt (\d+)", found["message"])
    return {**found, "jobMessage": status.get("message")} if seen and int(seen[1]) >= attempt else None


async def test_a_pod_refused_by_admission_is_the_jobs_status_backed_off_then_cleared(tmp_path: Path) -> None:
    emu = Emulator(tmp_path)
    emu.kmock = AdmittingEmulator()
    emu.server = kmock.Server(emu.kmock)
    async with emu:
        op = Operator(emu, "op-a").start()
        try:
            await _refused_then_admitted(emu, op)
        finally:
            await asyncio.to_thread(op.stop)


async def _refused_then_admitted(emu: Emulator, op: Operator) -> None:
    await emu.create_job("locked", tiny_spec())
    try:
        first = await wait_for(lambda: refused_condition(emu, "locked", 1), timeout=60, what="refused")
        third = await wait_for(lambda: refused_condition(emu, "locked", 3), timeout=60, what="3 tries")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{op.log()[-3000:]}") from None
    assert first["status"] == "True" and first["reason"] == "PodSecurityRefused"
    assert "refused by the API server: HTTP 403 Forbidden" in first["message"]
    assert re.search(r"Pod locked-(learner|rollout)-\d \((learner|rollout)\)", first["message"]), first
    assert 'violates PodSecurity "restricted:latest"' in first["message"]
    assert re.search(r'pods "locked-\w+-\d" is forbidden', first["message"]), first
    assert str(third["jobMessage"]).startswith("refused: Pod locked-")
    # Exponential backoff (the operator runs with base 0.5 s, at most 2 s): 0.5, 1, 2, 2, ...
    waits = [float(w) for w in re.findall(r"next in ([\d.]+)s", third["message"])]
    assert waits and waits[0] >= 2.0, third
    refused_events = [e for e in await emu.events() if e["reason"] == cond.CREATE_REFUSED]
    # Announced when first refused, not again at each backoff (the words did not change).
    assert 1 <= len(refused_events) <= 5, [e["message"] for e in refused_events]
    assert all("violates PodSecurity" in e["message"] for e in refused_events)
    assert all(e["involvedObject"]["name"] == "locked" for e in refused_events)
    assert await emu.pods("locked") == {}

    emu.kmock.refusing = False  # the namespace now admits them
    await wait_for(lambda: _pods(emu, "locked", 3), timeout=60, what="the pods once admitted")

    async def cleared() -> bool:
        status = ((await emu.job("locked")) or {}).get("status") or {}
        gone = cond.condition(status.get("conditions") or [], cond.CREATE_REFUSED) is None
        return gone and not str(status.get("message") or "").startswith("refused")

    await wait_for(cleared, timeout=30, what="the refusal condition to go")


async def _pods(emu: Emulator, job: str, count: int) -> bool:
    return len(await emu.pods(job)) == count
