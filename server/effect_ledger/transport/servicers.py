"""The gRPC servicers. Each method reads like a short script: map the request, run one use
case inside one unit of work (authenticated, role-checked), map the result."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from effect_ledger.config import Limits
from effect_ledger.domain.contracts import REFUSED_CHARACTERS, check_text
from effect_ledger.domain.lifecycle import Report, ReportKind
from effect_ledger.domain.model import Principal, Role
from effect_ledger.domain.tokens import check_certificate_binding, token_hash
from effect_ledger.errors import InvalidArgument, PermissionDenied, Unauthenticated
from effect_ledger.service import argument_checks, authorize_fast, queries, replay, reports_fast, runs, tools
from effect_ledger.service.attempts import parse_lookup, parse_receipt
from effect_ledger.service.authorize import AuthorizeRequest, early_check, validate_authorize
from effect_ledger.service.gate import Gate
from effect_ledger.storage import repository as repo
from effect_ledger.storage.engine import Database, UnitOfWork
from effect_ledger.transport import guard, mapping, peer, roles
from effectledger.v1 import (
    gate_pb2,
    gate_pb2_grpc,
    runs_pb2,
    runs_pb2_grpc,
    tools_pb2,
    tools_pb2_grpc,
)

T = TypeVar("T")


def bearer_token(context: grpc.aio.ServicerContext) -> str:
    token = guard.bearer_token(context.invocation_metadata())
    if token is None:
        raise guard.missing_token()
    return token


class Application:
    """What every servicer shares: the database, the limits, and authentication."""

    def __init__(self, database: Database, gate: Gate, limits: Limits) -> None:
        self.database = database
        self.gate = gate
        self.limits = limits

    async def call(
        self,
        context: grpc.aio.ServicerContext,
        roles: frozenset[Role],
        work: Callable[[UnitOfWork, Principal], Awaitable[T]],
    ) -> T:
        """Run ``work`` in one unit of work as the caller, authenticated under current facts."""
        hashed = token_hash(bearer_token(context))
        subject = peer.client_subject(context)

        async def authenticated(unit: UnitOfWork) -> T:
            principal, now = await repo.authenticate(unit.connection, hashed)
            if principal is None or now is None:
                raise Unauthenticated("unknown or disabled token", reason="TOKEN_UNKNOWN")
            check_certificate_binding(principal, subject)
            unit.now = now
            guard.authenticated_as(principal)
            if not principal.has_any(roles):
                raise PermissionDenied(
                    f"needs one of the roles {sorted(r.value for r in roles)}",
                    reason="ROLE_REQUIRED",
                    metadata={"principal_id": principal.principal_id},
                )
            return await work(unit, principal)

        return await self.database.run(authenticated, read_clock=False)

    async def authenticate(self, token: str, peer_subject: str | None) -> Principal:
        """The principal of a bearer token, under current facts (known, enabled, not expired,
        from the client certificate it is bound to; any role)."""
        hashed = token_hash(token)

        async def work(unit: UnitOfWork) -> Principal:
            principal, _now = await repo.authenticate(unit.connection, hashed)
            if principal is None:
                raise Unauthenticated("unknown or disabled token", reason="TOKEN_UNKNOWN")
            check_certificate_binding(principal, peer_subject)
            return principal

        return await self.database.run(work, read_clock=False)

    async def caller_holding(self, context: grpc.aio.ServicerContext, allowed: frozenset[Role]) -> Principal | None:
        """The caller, authenticated, when it holds one of ``allowed``; None when it holds none
        (``call`` then refuses it). For work done before a call's unit of work, so that only a
        caller entitled to the call can have it done."""
        principal = await self.authenticate(bearer_token(context), peer.client_subject(context))
        guard.authenticated_as(principal)
        return principal if principal.has_any(allowed) else None

    async def call_driver(
        self,
        context: grpc.aio.ServicerContext,
        work: Callable[[Any, str, str | None], Awaitable[T]],
    ) -> T:
        """Run ``work`` on the database driver's own connection (PostgreSQL's fast paths),
        with the caller's token hash and client certificate subject: the work authenticates in
        its first round trip."""
        hashed = token_hash(bearer_token(context))
        subject = peer.client_subject(context)
        return await self.database.run_driver(lambda driver: work(driver, hashed, subject))

    def page(self, request: Any) -> tuple[int, str]:
        """A paged request's page size (checked against the limits) and the position its page
        starts after (its page token, decoded)."""
        size = self.page_size(request.page_size, self.limits.page_size_default, self.limits.page_size_max)
        return size, decode_token(request.page_token)

    def page_size(self, requested: int, default: int, maximum: int) -> int:
        if requested < 0 or requested > maximum:
            raise InvalidArgument.field("page_size", f"must be between 0 and {maximum}", reason="INVALID_PAGE_SIZE")
        return requested or default


def decode_token(token: str, field: str = "page_token") -> str:
    if not token:
        return ""
    try:
        value = base64.b64decode(token.encode("ascii"), altchars=b"-_", validate=True).decode("utf-8")
    except (ValueError, UnicodeError):
        value = "\x00"
    if REFUSED_CHARACTERS.search(value):  # what this service issues holds no control character
        raise InvalidArgument.field(field, "is not a token this service issued", reason="INVALID_PAGE_TOKEN")
    return value


def encode_token(value: str) -> str:
    return base64.urlsafe_b64encode(value.encode("utf-8")).decode("ascii")


class ToolRegistryServicer(tools_pb2_grpc.ToolRegistryServicer):
    def __init__(self, app: Application) -> None:
        self.app = app

    async def PutToolContract(self, request, context):
        proposed = mapping.contract_from_proto(request.contract)
        expected = request.expected_revision if request.HasField("expected_revision") else None
        problems = None
        if proposed.arguments_schema is not None:
            # Checked in a worker process before the unit of work (RE2 compiles each pattern: the
            # largest schema the limits allow takes up to seconds), once the caller is known.
            principal = await self.app.caller_holding(context, roles.of("ToolRegistry", "PutToolContract"))
            if principal is not None:
                problems = await argument_checks.CHECKER.schema_problems(proposed.arguments_schema, principal.tenant_id)
        contract = await self.app.call(
            context,
            roles.of("ToolRegistry", "PutToolContract"),
            lambda unit, principal: tools.put_contract(unit, principal, proposed, expected, problems),
        )
        return mapping.contract_to_proto(contract)

    async def GetToolContract(self, request, context):
        contract = await self.app.call(
            context,
            roles.of("ToolRegistry", "GetToolContract"),
            lambda unit, principal: tools.get_contract(unit, principal, request.tool, request.revision),
        )
        return mapping.contract_to_proto(contract)

    async def ListToolContracts(self, request, context):
        size, after = self.app.page(request)
        found = await self.app.call(
            context,
            roles.of("ToolRegistry", "ListToolContracts"),
            lambda unit, principal: tools.list_contracts(unit, principal, after, size, request.include_retired),
        )
        next_token = encode_token(found[-1].tool) if len(found) == size else ""
        return tools_pb2.ListToolContractsResponse(
            contracts=[mapping.contract_to_proto(c) for c in found], next_page_token=next_token
        )

    async def RetireTool(self, request, context):
        contract = await self.app.call(
            context,
            roles.of("ToolRegistry", "RetireTool"),
            lambda unit, principal: tools.retire_tool(unit, principal, request.tool, request.reason),
        )
        return mapping.contract_to_proto(contract)


class RunsServicer(runs_pb2_grpc.RunsServicer):
    def __init__(self, app: Application) -> None:
        self.app = app

    async def CreateRun(self, request, context):
        labels = dict(request.labels)
        run = await self.app.call(
            context,
            roles.of("Runs", "CreateRun"),
            lambda unit, principal: runs.create_run(
                unit,
                principal,
                request.request_id,
                labels,
                self.app.limits,
                (request.provider, request.model, request.adapter),
            ),
        )
        return mapping.run_to_proto(run)

    async def GetRun(self, request, context):
        run = await self.app.call(
            context,
            roles.of("Runs", "GetRun"),
            lambda unit, principal: runs.get_run(unit, principal, request.run_id),
        )
        return mapping.run_to_proto(run)

    async def ListRunEvents(self, request, context):
        limits = self.app.limits
        size = self.app.page_size(request.page_size, limits.events_page_size_default, limits.events_page_size_max)
        events = await self.app.call(
            context,
            roles.of("Runs", "ListRunEvents"),
            lambda unit, principal: runs.list_events(unit, principal, request.run_id, request.after_revision, size),
        )
        return runs_pb2.ListRunEventsResponse(
            events=[mapping.event_to_proto(e) for e in events],
            next_after_revision=events[-1].revision if len(events) == size else 0,
        )

    async def ListRuns(self, request, context):
        size, after = self.app.page(request)
        created = queries.CreatedRange(
            mapping.optional_time(request, "created_after"), mapping.optional_time(request, "created_before")
        )
        page = await self.app.call(
            context,
            roles.of("Runs", "ListRuns"),
            lambda unit, principal: queries.list_runs(
                unit,
                principal,
                label_key=request.label_key,
                label_value=request.label_value,
                created=created,
                after_id=after,
                limit=size,
            ),
        )
        return runs_pb2.ListRunsResponse(
            runs=[mapping.run_to_proto(r) for r in page.items],
            next_page_token=encode_token(page.next_after) if page.next_after else "",
        )


class GateServicer(gate_pb2_grpc.GateServicer):
    def __init__(self, app: Application) -> None:
        self.app = app
        self.gate = app.gate

    async def AuthorizeEffect(self, request, context):
        command = AuthorizeRequest(
            run_id=request.run_id,
            tool=request.tool,
            arguments_json=request.arguments_json,
            idempotency_key=request.idempotency_key,
            target=request.target,
            estimate=dict(request.estimate),
            begin_dispatched=request.begin_dispatched,
        )
        arguments = validate_authorize(command, self.app.limits)
        # Before any transaction: a costly check never holds the database (service/authorize.py).
        early = await early_check(command, arguments)
        if self.app.database.dialect == "postgresql":
            try:
                result = await self.app.call_driver(
                    context,
                    lambda driver, hashed, subject: authorize_fast.authorize(
                        self.gate,
                        driver,
                        hashed,
                        roles.of("Gate", "AuthorizeEffect"),
                        command,
                        arguments,
                        subject,
                        early,
                    ),
                )
                return mapping.authorize_response(result)
            except authorize_fast.Fallback:
                pass  # nothing was written: the general path decides
        result = await self.app.call(
            context,
            roles.of("Gate", "AuthorizeEffect"),
            lambda unit, principal: self.gate.authorize(unit, principal, command, arguments, early),
        )
        return mapping.authorize_response(result)

    async def _fast_report(
        self, context, allowed: frozenset[Role], attempt_id: str, make_report: Callable[[Any], Report]
    ) -> Any:
        """PostgreSQL's two-round-trip report by a caller holding one of ``allowed``; None when
        the general path must decide."""
        if self.app.database.dialect != "postgresql":
            return None
        try:
            return await self.app.call_driver(
                context,
                lambda driver, hashed, subject: reports_fast.report(
                    self.gate, driver, hashed, allowed, attempt_id, make_report, subject
                ),
            )
        except authorize_fast.Fallback:
            return None  # nothing was written

    async def RecordDispatch(self, request, context):
        report = Report(ReportKind.DISPATCHED)
        result = await self._fast_report(
            context, roles.of("Gate", "RecordDispatch"), request.attempt_id, lambda now: report
        )
        if result is None:
            result = await self.app.call(
                context,
                roles.of("Gate", "RecordDispatch"),
                lambda unit, principal: self.gate.report(unit, principal, request.attempt_id, report),
            )
        return mapping.attempt_response(result)

    async def RenewLease(self, request, context):
        result = None
        if self.app.database.dialect == "postgresql":
            try:
                result = await self.app.call_driver(
                    context,
                    lambda driver, hashed, subject: reports_fast.renew_lease(
                        self.gate, driver, hashed, roles.of("Gate", "RenewLease"), request.attempt_id, subject
                    ),
                )
            except authorize_fast.Fallback:
                result = None
        if result is None:
            result = await self.app.call(
                context,
                roles.of("Gate", "RenewLease"),
                lambda unit, principal: self.gate.renew_lease(unit, principal, request.attempt_id),
            )
        return mapping.attempt_response(result)

    async def RecordOutcome(self, request, context):
        which = request.WhichOneof("outcome")
        if which is None:
            raise InvalidArgument.field(
                "outcome", "one of succeeded, failed, unknown is required", reason="FIELD_REQUIRED"
            )

        result = await self._fast_report(
            context,
            roles.of("Gate", "RecordOutcome"),
            request.attempt_id,
            lambda now: self._report(request, which, now),
        )
        if result is not None:
            return mapping.attempt_response(result)

        async def work(unit: UnitOfWork, principal: Principal):
            return await self.gate.report(unit, principal, request.attempt_id, self._report(request, which, unit.now))

        return mapping.attempt_response(await self.app.call(context, roles.of("Gate", "RecordOutcome"), work))

    def _report(self, request, which: str, now: Any) -> Report:
        if which == "succeeded":
            if not request.succeeded.HasField("receipt"):
                raise InvalidArgument.field("succeeded.receipt", "is required", reason="FIELD_REQUIRED")
            receipt = request.succeeded.receipt
            return Report(
                ReportKind.SUCCEEDED,
                receipt=parse_receipt(
                    receipt.provider_reference, receipt.detail_json, now, self.app.limits, "succeeded.receipt"
                ),
                usage=dict(request.succeeded.usage) or None,
            )
        if which == "failed":
            check_text(request.failed.reason, "failed.reason", required=True, lines=True)
            return Report(
                ReportKind.FAILED,
                reason=request.failed.reason,
                failure_evidence=mapping.failure_evidence(request.failed.evidence),
            )
        check_text(request.unknown.reason, "unknown.reason", required=False, lines=True)
        return Report(ReportKind.UNKNOWN, reason=request.unknown.reason)

    async def ReleaseAttempt(self, request, context):
        report = Report(ReportKind.RELEASED, reason=check_text(request.reason, "reason", required=False, lines=True))
        result = await self._fast_report(
            context, roles.of("Gate", "ReleaseAttempt"), request.attempt_id, lambda now: report
        )
        if result is None:
            result = await self.app.call(
                context,
                roles.of("Gate", "ReleaseAttempt"),
                lambda unit, principal: self.gate.report(unit, principal, request.attempt_id, report),
            )
        return mapping.attempt_response(result)

    async def ReconcileEffect(self, request, context):
        which = request.WhichOneof("evidence")
        if which is None:
            raise InvalidArgument.field("evidence", "a receipt or not_happened is required", reason="FIELD_REQUIRED")

        async def work(unit: UnitOfWork, principal: Principal):
            receipt = None
            reason = ""
            lookup = None
            if which == "receipt":
                receipt = parse_receipt(
                    request.receipt.provider_reference,
                    request.receipt.detail_json,
                    unit.now,
                    self.app.limits,
                    "receipt",
                )
            else:
                reason = check_text(request.not_happened.reason, "not_happened.reason", required=True, lines=True)
                lookup = parse_lookup(
                    request.not_happened.lookup_reference,
                    request.not_happened.lookup_result_json,
                    self.app.limits,
                    "not_happened",
                )
            return await self.gate.reconcile(unit, principal, request.effect_id, receipt, reason, lookup)

        effect = await self.app.call(context, roles.of("Gate", "ReconcileEffect"), work)
        return mapping.effect_to_proto(effect)

    async def GetEffect(self, request, context):
        effect = await self.app.call(
            context,
            roles.of("Gate", "GetEffect"),
            lambda unit, principal: self.gate.get_effect(unit, principal, request.effect_id),
        )
        return mapping.effect_to_proto(effect)

    async def ListOpenEffects(self, request, context):
        size, after = self.app.page(request)
        found = await self.app.call(
            context,
            roles.of("Gate", "ListOpenEffects"),
            lambda unit, principal: self.gate.list_open_effects(unit, principal, request.run_id, after, size),
        )
        return gate_pb2.ListOpenEffectsResponse(
            effects=[mapping.effect_to_proto(e) for e in found],
            next_page_token=encode_token(found[-1].effect_id) if len(found) == size else "",
        )

    async def GetDecision(self, request, context):
        decision = await self.app.call(
            context,
            roles.of("Gate", "GetDecision"),
            lambda unit, principal: self.gate.get_decision(unit, principal, request.decision_id),
        )
        return mapping.decision_to_proto(decision)

    async def ReplayDecision(self, request, context):
        found = await self.app.call(
            context,
            roles.of("Gate", "ReplayDecision"),
            lambda unit, principal: replay.replay_decision(
                unit, principal, self.gate, self.gate.policy, request.decision_id
            ),
        )
        return mapping.replay_to_proto(found)

    async def ListEffects(self, request, context):
        size, after = self.app.page(request)
        stages = mapping.stages_filter(request.stages)
        created = queries.CreatedRange(
            mapping.optional_time(request, "created_after"), mapping.optional_time(request, "created_before")
        )
        page = await self.app.call(
            context,
            roles.of("Gate", "ListEffects"),
            lambda unit, principal: queries.list_effects(
                unit,
                principal,
                stages=stages,
                tool=request.tool,
                run_id=request.run_id,
                target=request.target,
                created=created,
                after_id=after,
                limit=size,
            ),
        )
        return gate_pb2.ListEffectsResponse(
            effects=[mapping.effect_to_proto(e) for e in page.items],
            next_page_token=encode_token(page.next_after) if page.next_after else "",
        )

    async def ListDecisions(self, request, context):
        size, after = self.app.page(request)
        outcome = mapping.outcome_filter(request.outcome)
        page = await self.app.call(
            context,
            roles.of("Gate", "ListDecisions"),
            lambda unit, principal: queries.list_decisions(
                unit,
                principal,
                outcome=outcome,
                reason_code=request.reason,
                run_id=request.run_id,
                tool=request.tool,
                after_id=after,
                limit=size,
            ),
        )
        return gate_pb2.ListDecisionsResponse(
            decisions=[mapping.decision_to_proto(d) for d in page.items],
            next_page_token=encode_token(page.next_after) if page.next_after else "",
        )
