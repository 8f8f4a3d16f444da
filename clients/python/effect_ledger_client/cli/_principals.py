"""``principals list|disable|enable|rotate|expire``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer

from effect_ledger_client.cli._app import (
    LIMIT_DEFAULT,
    PAGE_SIZE_DEFAULT,
    Ctl,
    Limit,
    PageSize,
    command,
    group,
)
from effect_ledger_client.cli._data import message_to_data
from effect_ledger_client.cli._render import PRINCIPAL
from effect_ledger_client.cli._values import (
    DURATION,
    BadValue,
    Output,
    duration,
    instant,
    timestamp,
)
from effect_ledger_client.proto import principals_pb2

principals = group("Principals of the tenant and their tokens (admins; anyone may list and rotate itself).")

PrincipalId = Annotated[str, typer.Argument(metavar="PRINCIPAL_ID", help="The principal's id.")]


@command(principals, "list")
def list_principals(ctl: Ctl, limit: Limit = LIMIT_DEFAULT, page_size: PageSize = PAGE_SIZE_DEFAULT) -> None:
    """Every principal of the tenant; for anyone but an admin, only the caller (ListPrincipals)."""
    request = principals_pb2.ListPrincipalsRequest()
    found = ctl.collect(ctl.ledger.principals.ListPrincipals, request, "principals", limit=limit, page_size=page_size)
    ctl.printer.items(found, PRINCIPAL, "principals")


@command(principals, "disable")
def disable(ctl: Ctl, principal_id: PrincipalId) -> None:
    """Refuse the principal's next call, on every replica (DisablePrincipal; never oneself)."""
    request = principals_pb2.DisablePrincipalRequest(principal_id=principal_id)
    ctl.printer.item(ctl.ledger.principals.DisablePrincipal(request), PRINCIPAL)


@command(principals, "enable")
def enable(ctl: Ctl, principal_id: PrincipalId) -> None:
    """Let a disabled principal call again (EnablePrincipal)."""
    request = principals_pb2.EnablePrincipalRequest(principal_id=principal_id)
    ctl.printer.item(ctl.ledger.principals.EnablePrincipal(request), PRINCIPAL)


@command(principals, "rotate")
def rotate(
    ctl: Ctl,
    principal_id: PrincipalId,
    expires_in: Annotated[
        str | None, typer.Option(help="Admins: the new token expires this long after it is issued (90d, 12h).")
    ] = None,
) -> None:
    """Issue a new token, shown this once; the old one stops working at once (RotateToken).
    With -o ids, only the token is printed."""
    request = principals_pb2.RotateTokenRequest(principal_id=principal_id)
    if expires_in is not None:
        try:
            request.expires_in_seconds = int(duration(expires_in).total_seconds())
        except BadValue as error:
            raise BadValue(f"--expires-in: {error}") from None
    response = ctl.ledger.principals.RotateToken(request)
    if ctl.output is Output.IDS:
        ctl.printer.ids([response.token])
    elif ctl.output is not Output.TABLE:
        ctl.printer.dump(message_to_data(response))
    else:
        ctl.printer.item(response.principal, PRINCIPAL)
        ctl.printer.key_values([("token", response.token)])


@command(principals, "expire")
def expire(
    ctl: Ctl,
    principal_id: PrincipalId,
    at: Annotated[str | None, typer.Option(help="The instant the token stops working: ISO 8601, or now.")] = None,
    in_: Annotated[
        str | None, typer.Option("--in", help="The token stops working this long from now (30m, 7d).")
    ] = None,
    never: Annotated[bool, typer.Option("--never", help="The token does not expire.")] = False,
) -> None:
    """Set when the principal's token stops working (SetTokenExpiry; admins)."""
    if sum([at is not None, in_ is not None, never]) != 1:
        raise BadValue("give one of --at, --in or --never")
    request = principals_pb2.SetTokenExpiryRequest(principal_id=principal_id)
    if never:
        request.never = True
    elif at is not None:
        if DURATION.match(at.strip()):
            raise BadValue("--at takes an instant (ISO 8601, or now); a duration from now is --in")
        try:
            request.expires_at.CopyFrom(timestamp(instant(at)))
        except BadValue as error:
            raise BadValue(f"--at: {error}") from None
    else:
        try:
            request.expires_at.CopyFrom(timestamp(datetime.now(UTC) + duration(in_ or "")))
        except BadValue as error:
            raise BadValue(f"--in: {error}") from None
    ctl.printer.item(ctl.ledger.principals.SetTokenExpiry(request), PRINCIPAL)
