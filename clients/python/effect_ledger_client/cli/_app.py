"""The application: the options every command takes, the client they make, paging, and how a
failure becomes one line on standard error and an exit code."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from google.protobuf.message import Message

from effect_ledger_client._retry import RetryPolicy
from effect_ledger_client._version import PROTO_PACKAGE, __version__
from effect_ledger_client.cli._render import Printer
from effect_ledger_client.cli._values import BadValue, Output
from effect_ledger_client.errors import (
    AlreadyExists,
    Conflict,
    DeadlineExceeded,
    FailedPrecondition,
    FieldViolation,
    Internal,
    InvalidArgument,
    LedgerError,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from effect_ledger_client.ledger import Ledger

PROGRAM = "effect-ledger-ctl"
GLOBAL_PANEL = "Connection and output"
SERVER_DEFAULT = "127.0.0.1:50051"
TIMEOUT_SECONDS_DEFAULT = 10.0
# A bearer token is under a hundred bytes; a larger file is not a token file.
TOKEN_FILE_SIZE_MAX_BYTES = 4096
LIMIT_DEFAULT = 1000
PAGE_SIZE_DEFAULT = 100
PAGE_SIZE_MAX = 500
# A page may come back short, even empty, and still have a next page; this many pages at most.
PAGES_MAX = 10_000

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_OTHER_STATUS = 14
EXIT_INTERRUPTED = 130
# One exit code per typed error of the client (effect_ledger_client.errors); docs/cli.md lists them.
EXIT_CODE_BY_ERROR: dict[type[LedgerError], int] = {
    InvalidArgument: 3,
    NotFound: 4,
    AlreadyExists: 5,
    FailedPrecondition: 6,
    PermissionDenied: 7,
    Unauthenticated: 8,
    Conflict: 9,
    ResourceExhausted: 10,
    Unavailable: 11,
    DeadlineExceeded: 12,
    Internal: 13,
}


@dataclass(frozen=True)
class Settings:
    server: str
    token: str
    ca_file: Path | None
    cert_file: Path | None
    key_file: Path | None
    timeout_seconds: float
    output: Output


class Ctl:
    """What a command works with: its settings, a printer, and a client made on first use."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.printer = Printer(settings.output)
        self._ledger: Ledger | None = None

    @property
    def output(self) -> Output:
        return self.settings.output

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            settings = self.settings
            self._ledger = Ledger(
                settings.server,
                settings.token,
                root_certificates=settings.ca_file,
                client_certificate=settings.cert_file,
                client_key=settings.key_file,
                timeout_seconds=settings.timeout_seconds,
                # A read that meets an unavailable server is tried again, within the timeout.
                retry=RetryPolicy(total_seconds_max=settings.timeout_seconds),
            )
        return self._ledger

    def close(self) -> None:
        if self._ledger is not None:
            self._ledger.close()

    def collect(
        self, call: Callable[[Any], Any], request: Message, items: str, *, limit: int, page_size: int
    ) -> list[Any]:
        """Calls ``call`` page after page until ``limit`` items or the last page; says on
        standard error when it stopped at the limit with more to come."""
        found: list[Any] = []
        for _ in range(PAGES_MAX):
            request.page_size = min(page_size, limit - len(found))  # type: ignore[attr-defined]
            response = call(request)
            found.extend(getattr(response, items))
            request.page_token = response.next_page_token  # type: ignore[attr-defined]
            if not response.next_page_token or len(found) >= limit:
                break
        if response.next_page_token:
            self.printer.note(f"note: stopped at {min(len(found), limit)} {items} (--limit {limit}); there are more")
        return found[:limit]


# --- the options every command takes ---------------------------------------------------------


def _global(*names: str, envvar: str, help: str, **extra: Any) -> Any:
    return typer.Option(*names, envvar=envvar, help=help, rich_help_panel=GLOBAL_PANEL, **extra)


_KEYWORD = inspect.Parameter.KEYWORD_ONLY
GLOBAL_PARAMETERS = [
    inspect.Parameter(
        "server",
        _KEYWORD,
        default=SERVER_DEFAULT,
        annotation=Annotated[
            str, _global("--server", envvar="EFFECT_LEDGER_SERVER", help="The ledger's address, host:port.")
        ],
    ),
    inspect.Parameter(
        "token",
        _KEYWORD,
        default=None,
        annotation=Annotated[
            str | None,
            _global(
                "--token",
                envvar="EFFECT_LEDGER_TOKEN",
                show_default=False,
                help="Bearer token. Prefer --token-file: a command line is visible to other users.",
            ),
        ],
    ),
    inspect.Parameter(
        "token_file",
        _KEYWORD,
        default=None,
        annotation=Annotated[
            Path | None,
            _global(
                "--token-file",
                envvar="EFFECT_LEDGER_TOKEN_FILE",
                exists=True,
                dir_okay=False,
                help="A file holding the bearer token.",
            ),
        ],
    ),
    inspect.Parameter(
        "ca_file",
        _KEYWORD,
        default=None,
        annotation=Annotated[
            Path | None,
            _global(
                "--ca-file",
                envvar="EFFECT_LEDGER_CA_FILE",
                exists=True,
                dir_okay=False,
                help="TLS: the CA bundle (PEM) the server's certificate is checked against. Without TLS "
                "options the connection is plaintext.",
            ),
        ],
    ),
    inspect.Parameter(
        "cert_file",
        _KEYWORD,
        default=None,
        annotation=Annotated[
            Path | None,
            _global(
                "--cert-file",
                envvar="EFFECT_LEDGER_CERT_FILE",
                exists=True,
                dir_okay=False,
                help="mTLS: this client's certificate chain (PEM), with --key-file.",
            ),
        ],
    ),
    inspect.Parameter(
        "key_file",
        _KEYWORD,
        default=None,
        annotation=Annotated[
            Path | None,
            _global(
                "--key-file",
                envvar="EFFECT_LEDGER_KEY_FILE",
                exists=True,
                dir_okay=False,
                help="mTLS: this client's private key (PEM), with --cert-file.",
            ),
        ],
    ),
    inspect.Parameter(
        "timeout",
        _KEYWORD,
        default=TIMEOUT_SECONDS_DEFAULT,
        annotation=Annotated[
            float,
            _global("--timeout", envvar="EFFECT_LEDGER_TIMEOUT", help="Seconds to wait for the answer to each call."),
        ],
    ),
    inspect.Parameter(
        "output",
        _KEYWORD,
        default=Output.TABLE,
        annotation=Annotated[
            Output,
            _global(
                "--output",
                "-o",
                envvar="EFFECT_LEDGER_OUTPUT",
                case_sensitive=False,
                help="table for people; json or yaml for programs; ids: one identifier a line.",
            ),
        ],
    ),
]
GLOBAL_NAMES = [parameter.name for parameter in GLOBAL_PARAMETERS]
CONTEXT_PARAMETER = inspect.Parameter("ctx", _KEYWORD, annotation=typer.Context)


def _given_on_command_line(ctx: typer.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def _read_token(path: Path) -> str:
    try:
        with path.open("rb") as file:
            raw = file.read(TOKEN_FILE_SIZE_MAX_BYTES + 1)
    except OSError as error:
        raise BadValue(f"--token-file {path}: {error.strerror}") from None
    if len(raw) > TOKEN_FILE_SIZE_MAX_BYTES:
        raise BadValue(f"--token-file {path}: larger than {TOKEN_FILE_SIZE_MAX_BYTES} bytes, not a token")
    token = raw.decode("utf-8", "replace").strip()
    if not token:
        raise BadValue(f"--token-file {path}: empty")
    return token


def _token(ctx: typer.Context, token: str | None, token_file: Path | None) -> str:
    """--token or --token-file; one given on the command line wins over the environment."""
    if token and token_file:
        on_line = {name for name in ("token", "token_file") if _given_on_command_line(ctx, name)}
        if len(on_line) != 1:
            raise BadValue("give --token or --token-file, not both")
        if on_line == {"token"}:
            token_file = None
        else:
            token = None
    if token_file is not None:
        return _read_token(token_file)
    if token:
        return token.strip()
    raise BadValue("no token: give --token-file (or EFFECT_LEDGER_TOKEN_FILE) or --token (or EFFECT_LEDGER_TOKEN)")


def settings_from(ctx: typer.Context, values: dict[str, Any]) -> Settings:
    if values["timeout"] <= 0:
        raise BadValue("--timeout must be a positive number of seconds")
    if (values["cert_file"] is None) != (values["key_file"] is None):
        raise BadValue("--cert-file and --key-file go together")
    return Settings(
        server=values["server"],
        token=_token(ctx, values["token"], values["token_file"]),
        ca_file=values["ca_file"],
        cert_file=values["cert_file"],
        key_file=values["key_file"],
        timeout_seconds=values["timeout"],
        output=values["output"],
    )


F = TypeVar("F", bound=Callable[..., None])


def command(group: typer.Typer, name: str) -> Callable[[F], F]:
    """Registers ``function(ctl, **options)`` as the command ``name`` of ``group``, with the
    global options added to its own: it is called with a Ctl made from them."""

    def decorate(function: F) -> F:
        own = list(inspect.signature(function, eval_str=True).parameters.values())[1:]
        parameters = [CONTEXT_PARAMETER, *(p.replace(kind=_KEYWORD) for p in own), *GLOBAL_PARAMETERS]

        def run_command(ctx: typer.Context, **values: Any) -> None:
            ctl = Ctl(settings_from(ctx, {option: values.pop(option) for option in GLOBAL_NAMES}))
            try:
                function(ctl, **values)
            finally:
                ctl.close()

        run_command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        run_command.__annotations__ = {p.name: p.annotation for p in parameters}
        run_command.__doc__ = function.__doc__
        run_command.__name__ = function.__name__
        group.command(name)(run_command)
        return function

    return decorate


def group(help: str) -> typer.Typer:
    return typer.Typer(help=help, no_args_is_help=True, add_completion=False)


# Options shared by the list commands.
Limit = Annotated[int, typer.Option("--limit", min=1, help="At most this many in all; pages are followed up to it.")]
PageSize = Annotated[int, typer.Option("--page-size", min=1, max=PAGE_SIZE_MAX, help="How many to ask for per call.")]
Since = Annotated[
    str | None,
    typer.Option(
        help="Created at or after this instant: ISO 8601 (2026-05-01T09:30:00Z), or a duration ago (15m, 2h, 7d)."
    ),
]
Until = Annotated[str | None, typer.Option(help="Created before this instant (the same forms as --since).")]


# --- failures --------------------------------------------------------------------------------


def one_line(text: str) -> str:
    return " ".join(text.split())


def error_line(error: LedgerError) -> str:
    """``NOT_FOUND (EFFECT_NOT_FOUND): effect eff_... not found``, with the fields a
    BadRequest named and the delay a RetryInfo asked for."""
    code = error.code.name
    head = code if error.reason == code else f"{code} ({error.reason})"
    fields = [f"{v.field}: {v.description}" for v in error.violations if isinstance(v, FieldViolation)]
    text = f"{head}: {error.message}"
    if fields and not all(f in error.message for f in fields):
        text += "; " + "; ".join(fields)
    if error.retry_after_seconds is not None:
        text += f" (retry after {error.retry_after_seconds:g} s)"
    return one_line(text)


def exit_code_of(error: LedgerError) -> int:
    return EXIT_CODE_BY_ERROR.get(type(error), EXIT_OTHER_STATUS)


def _fail(message: str, code: int) -> int:
    Printer.note(f"error: {one_line(message)}")
    return code


def _version(value: bool) -> None:
    if value:
        typer.echo(f"{PROGRAM} {__version__} ({PROTO_PACKAGE})")
        raise typer.Exit()


app = typer.Typer(
    name=PROGRAM,
    help="Operate an effect ledger over gRPC: effects, approvals, budgets, schedules, tools, runs, "
    "decisions and principals. Every command takes the connection and output options (see any "
    "command's --help).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the client's version and exit.")
    ] = False,
) -> None:
    pass


def run(argv: Sequence[str] | None = None) -> int:
    """Runs the command line ``argv`` (default: the process's); returns the exit code."""
    from effect_ledger_client.cli import _commands  # noqa: F401  (registers the groups)

    try:
        result = typer.main.get_command(app).main(args=argv, prog_name=PROGRAM, standalone_mode=False)
    except typer.TyperException as error:
        return _usage_failure(error)
    except BadValue as error:
        return _fail(str(error), EXIT_USAGE)
    except LedgerError as error:
        return _fail(error_line(error), exit_code_of(error))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except typer.Abort:
        return _fail("aborted", EXIT_FAILURE)
    except Exception as error:  # noqa: BLE001 - the last resort: one line, never a traceback
        return _fail(f"{type(error).__name__}: {error}", EXIT_FAILURE)
    return result if isinstance(result, int) else EXIT_OK


def _usage_failure(error: typer.TyperException) -> int:
    ctx = getattr(error, "ctx", None)
    if type(error).__name__ == "NoArgsIsHelpError" and ctx is not None:
        typer.echo(ctx.get_help())  # a group without its command: its help
        return EXIT_USAGE
    hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
    return _fail(error.format_message() + hint, getattr(error, "exit_code", EXIT_USAGE))
