"""The Principals servicer: tokens that can be listed, disabled, rotated and expired."""

from __future__ import annotations

from effect_ledger.errors import InvalidArgument
from effect_ledger.service import principals
from effect_ledger.storage.principal_store import PrincipalRecord
from effect_ledger.transport import mapping, roles
from effect_ledger.transport.servicers import Application, encode_token
from effectledger.v1 import principals_pb2, principals_pb2_grpc


def principal_to_proto(record: PrincipalRecord) -> principals_pb2.Principal:
    return principals_pb2.Principal(
        principal_id=record.principal_id,
        roles=sorted(role.value for role in record.roles),
        created_at=mapping.timestamp(record.created_at),
        disabled_at=mapping.timestamp(record.disabled_at),
        token_expires_at=mapping.timestamp(record.token_expires_at),
        token_issued_at=mapping.timestamp(record.token_issued_at),
        client_subject=record.client_subject or "",
    )


class PrincipalsServicer(principals_pb2_grpc.PrincipalsServicer):
    def __init__(self, app: Application) -> None:
        self.app = app

    async def ListPrincipals(self, request, context):
        size, after = self.app.page(request)
        found = await self.app.call(
            context,
            roles.of("Principals", "ListPrincipals"),
            lambda unit, caller: principals.list_principals(unit, caller, after, size),
        )
        return principals_pb2.ListPrincipalsResponse(
            principals=[principal_to_proto(record) for record in found],
            next_page_token=encode_token(found[-1].principal_id) if len(found) == size else "",
        )

    async def DisablePrincipal(self, request, context):
        record = await self.app.call(
            context,
            roles.of("Principals", "DisablePrincipal"),
            lambda unit, caller: principals.disable(unit, caller, request.principal_id),
        )
        return principal_to_proto(record)

    async def EnablePrincipal(self, request, context):
        record = await self.app.call(
            context,
            roles.of("Principals", "EnablePrincipal"),
            lambda unit, caller: principals.enable(unit, caller, request.principal_id),
        )
        return principal_to_proto(record)

    async def RotateToken(self, request, context):
        seconds = request.expires_in_seconds if request.HasField("expires_in_seconds") else None
        record, token = await self.app.call(
            context,
            roles.of("Principals", "RotateToken"),
            lambda unit, caller: principals.rotate(unit, caller, request.principal_id, seconds),
        )
        return principals_pb2.RotateTokenResponse(principal=principal_to_proto(record), token=token)

    async def SetTokenExpiry(self, request, context):
        which = request.WhichOneof("expiry")
        if which is None:
            raise InvalidArgument.field("expiry", "expires_at or never is required", reason="FIELD_REQUIRED")
        expires_at = None
        if which == "expires_at":
            expires_at = mapping.time_from_proto(request.expires_at, "expires_at")
        record = await self.app.call(
            context,
            roles.of("Principals", "SetTokenExpiry"),
            lambda unit, caller: principals.set_expiry(unit, caller, request.principal_id, expires_at),
        )
        return principal_to_proto(record)
