"""The Schedules servicer: scheduled intents (service/schedules.py)."""

from __future__ import annotations

import asyncio

from effect_ledger.errors import LedgerError
from effect_ledger.service import schedules
from effect_ledger.service.schedules import ScheduleCommand
from effect_ledger.transport import mapping, roles, status
from effect_ledger.transport.servicers import Application, encode_token
from effectledger.v1 import schedules_pb2, schedules_pb2_grpc

WATCH_BATCH_MAX = 100
# A WatchDueIntents stream that has read everything due reads again this often (one indexed
# query of the tenant's due sequence each time); the scheduler fires at its own interval.
WATCH_POLL_INTERVAL_SECONDS = 0.5


class SchedulesServicer(schedules_pb2_grpc.SchedulesServicer):
    def __init__(self, app: Application) -> None:
        self.app = app

    async def ScheduleIntent(self, request, context):
        command = ScheduleCommand(
            run_id=request.run_id,
            tool=request.tool,
            arguments_json=request.arguments_json,
            idempotency_key=request.idempotency_key,
            target=request.target,
            purpose=mapping.schedule_purpose(request.purpose),
            not_before=mapping.request_time(request, "not_before"),
            delay_seconds=request.delay_seconds,
            deadline=mapping.request_time(request, "deadline"),
            cancel_conditions=mapping.cancel_conditions(request.cancel_conditions),
            hold_budget=request.hold_budget,
            note=request.note,
        )

        async def work(unit, principal):
            return mapping.schedule_to_proto(await schedules.schedule_intent(unit, principal, command, self.app.limits))

        return await self.app.call(context, roles.of("Schedules", "ScheduleIntent"), work)

    async def GetSchedule(self, request, context):
        async def work(unit, principal):
            return mapping.schedule_to_proto(await schedules.get(unit, principal, request.schedule_id))

        return await self.app.call(context, roles.of("Schedules", "GetSchedule"), work)

    async def ListSchedules(self, request, context):
        size, before = self.app.page(request)
        state = mapping.schedule_state_filter(request.state)

        async def work(unit, principal):
            found = await schedules.list_schedules(
                unit, principal, run_id=request.run_id, state=state, before_id=before, limit=size
            )
            return schedules_pb2.ListSchedulesResponse(
                schedules=[mapping.schedule_to_proto(s) for s in found],
                next_page_token=encode_token(found[-1].schedule_id) if len(found) == size else "",
            )

        return await self.app.call(context, roles.of("Schedules", "ListSchedules"), work)

    async def CancelSchedule(self, request, context):
        async def work(unit, principal):
            cancelled = await schedules.cancel(unit, principal, request.schedule_id, request.reason)
            return mapping.schedule_to_proto(cancelled)

        return await self.app.call(context, roles.of("Schedules", "CancelSchedule"), work)

    async def WatchDueIntents(self, request, context):
        """Every schedule of the tenant (or of one run) that fired after the cursor, in firing
        order; then, polling, new ones as they fire. Each read authenticates the caller again.
        It ends with the caller's deadline or the stream's lifetime; resume from the last
        sequence received."""
        cursor = request.after_sequence
        while True:
            batch = await self._read(context, request, cursor)
            for item in batch:
                cursor = item.sequence
                yield item
            if len(batch) < WATCH_BATCH_MAX:
                await asyncio.sleep(WATCH_POLL_INTERVAL_SECONDS)

    async def _read(self, context, request, cursor: int):
        async def work(unit, principal):
            found = await schedules.due_after(unit, principal, cursor, request.run_id, WATCH_BATCH_MAX)
            return [
                schedules_pb2.DueIntent(sequence=s.due_sequence or 0, schedule=mapping.schedule_to_proto(s))
                for s in found
            ]

        try:
            return await self.app.call(context, roles.of("Schedules", "WatchDueIntents"), work)
        except LedgerError as error:
            await context.abort_with_status(status.to_status(error))
