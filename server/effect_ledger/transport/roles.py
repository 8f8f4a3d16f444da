"""Who may call each RPC: the one table the servicers enforce and docs/api.md shows.

``Application.call`` refuses a caller that holds none of an RPC's roles (PERMISSION_DENIED,
``ROLE_REQUIRED``) before any work is done; every servicer method takes its role set from here
(``roles.of("Gate", "GetDecision")``). Every call acts within the caller's own tenant. Some RPCs
check more inside the service (whose attempt it is, who asked for an approval): ``note`` says
what, in a sentence the API reference shows beside the roles.

``tests/unit/test_api_reference.py`` checks that the table names every RPC of every service
and nothing else, and that each servicer method uses its own row.
"""

from __future__ import annotations

from dataclasses import dataclass

from effect_ledger.domain.approvals import DECIDING_ROLES
from effect_ledger.domain.model import RECONCILING_ROLES, Role

PACKAGE = "effectledger.v1"

EVERY_ROLE = frozenset(Role)
AGENTS = frozenset({Role.AGENT})
ADMINS = frozenset({Role.ADMIN})
AGENTS_AND_ADMINS = frozenset({Role.AGENT, Role.ADMIN})
# Who may call the RPCs that act on an attempt; whose attempt it may be is the gate's rule
# (gate_rules.foreign_attempts): agents act on their own, reconciling roles on any.
ATTEMPT_ACTORS = AGENTS | RECONCILING_ROLES
# Everyone who reviews or answers for decisions; not agents (a replay costs a policy evaluation).
DECISION_REVIEWERS = frozenset({Role.REVIEWER, Role.ADMIN, Role.AUDITOR, Role.OPERATOR})
DECIDERS = frozenset(DECIDING_ROLES)
REVOKERS = DECIDERS | AGENTS
ARTIFACT_WRITERS = frozenset({Role.AGENT, Role.ADMIN, Role.REVIEWER})
# Who may hold a run against retention: an auditor too (preserving evidence is its work); only
# an admin releases a hold.
HOLDERS = frozenset({Role.ADMIN, Role.AUDITOR})
NOBODY: frozenset[Role] = frozenset()

OWN_ATTEMPTS = (
    "An agent acts only on attempts it was allowed (ATTEMPT_NOT_OWNED); an operator or an admin "
    "on any attempt of its tenant."
)


@dataclass(frozen=True)
class RpcRoles:
    """The roles that may call one RPC, and what the service checks beyond them."""

    roles: frozenset[Role]
    note: str = ""


RPC_ROLES: dict[str, RpcRoles] = {
    # --- Gate ---
    f"{PACKAGE}.Gate/AuthorizeEffect": RpcRoles(AGENTS, "The caller becomes the owner of the attempt it is allowed."),
    f"{PACKAGE}.Gate/RecordDispatch": RpcRoles(ATTEMPT_ACTORS, OWN_ATTEMPTS),
    f"{PACKAGE}.Gate/RenewLease": RpcRoles(ATTEMPT_ACTORS, OWN_ATTEMPTS),
    f"{PACKAGE}.Gate/RecordOutcome": RpcRoles(ATTEMPT_ACTORS, OWN_ATTEMPTS),
    f"{PACKAGE}.Gate/ReleaseAttempt": RpcRoles(ATTEMPT_ACTORS, OWN_ATTEMPTS),
    f"{PACKAGE}.Gate/ReconcileEffect": RpcRoles(
        ATTEMPT_ACTORS,
        "An agent only when every open attempt of the effect is its own (ATTEMPT_NOT_OWNED), and "
        "settles one as not_happened only for a QUERY_THEN_RETRY tool, with the provider lookup "
        "(LOOKUP_EVIDENCE_REQUIRED); otherwise not_happened takes an operator or an admin that is "
        "not the attempt's principal (RECONCILE_NEEDS_OPERATOR), and from others than the owner "
        "only after the lease's grace (RECONCILE_TOO_EARLY). The reconcile policy may refuse more.",
    ),
    f"{PACKAGE}.Gate/GetEffect": RpcRoles(EVERY_ROLE),
    f"{PACKAGE}.Gate/ListOpenEffects": RpcRoles(EVERY_ROLE),
    f"{PACKAGE}.Gate/GetDecision": RpcRoles(EVERY_ROLE),
    f"{PACKAGE}.Gate/ListEffects": RpcRoles(EVERY_ROLE),
    f"{PACKAGE}.Gate/ListDecisions": RpcRoles(EVERY_ROLE),
    f"{PACKAGE}.Gate/ReplayDecision": RpcRoles(DECISION_REVIEWERS),
    # --- Runs ---
    f"{PACKAGE}.Runs/CreateRun": RpcRoles(AGENTS_AND_ADMINS),
    f"{PACKAGE}.Runs/GetRun": RpcRoles(EVERY_ROLE),
    f"{PACKAGE}.Runs/ListRunEvents": RpcRoles(EVERY_ROLE),
    f"{PACKAGE}.Runs/ListRuns": RpcRoles(EVERY_ROLE),
    # --- ToolRegistry ---
    f"{PACKAGE}.ToolRegistry/PutToolContract": RpcRoles(ADMINS),
    f"{PACKAGE}.ToolRegistry/GetToolContract": RpcRoles(EVERY_ROLE),
    f"{PACKAGE}.ToolRegistry/ListToolContracts": RpcRoles(EVERY_ROLE),
    f"{PACKAGE}.ToolRegistry/RetireTool": RpcRoles(ADMINS),
    # --- Approvals ---
    f"{PACKAGE}.Approvals/RequestApproval": RpcRoles(AGENTS),
    f"{PACKAGE}.Approvals/GetApproval": RpcRoles(EVERY_ROLE),
    f"{PACKAGE}.Approvals/ListApprovals": RpcRoles(EVERY_ROLE),
    f"{PACKAGE}.Approvals/DecideApproval": RpcRoles(
        DECIDERS,
        "Never the principal that requested the effect (SELF_APPROVAL); an approval never counts "
        "for an effect its approver executes (APPROVED_BY_EXECUTOR).",
    ),
    f"{PACKAGE}.Approvals/RevokeApproval": RpcRoles(
        REVOKERS, "An agent only an approval it requested (ROLE_REQUIRED)."
    ),
    f"{PACKAGE}.Approvals/WatchApprovals": RpcRoles(
        EVERY_ROLE, "Each read of the stream authenticates the caller and checks its roles again."
    ),
    # --- Budgets ---
    f"{PACKAGE}.Budgets/PutBudget": RpcRoles(ADMINS),
    f"{PACKAGE}.Budgets/GetBudget": RpcRoles(EVERY_ROLE),
    f"{PACKAGE}.Budgets/RecordUsage": RpcRoles(AGENTS_AND_ADMINS),
    f"{PACKAGE}.Budgets/ListBudgets": RpcRoles(EVERY_ROLE),
    # --- Checkpoints ---
    f"{PACKAGE}.Checkpoints/SealCheckpoint": RpcRoles(AGENTS_AND_ADMINS),
    f"{PACKAGE}.Checkpoints/RegisterCheckpoint": RpcRoles(AGENTS_AND_ADMINS),
    f"{PACKAGE}.Checkpoints/GetCheckpoint": RpcRoles(EVERY_ROLE),
    f"{PACKAGE}.Checkpoints/ListCheckpoints": RpcRoles(EVERY_ROLE),
    f"{PACKAGE}.Checkpoints/CheckResumeCompatibility": RpcRoles(EVERY_ROLE),
    f"{PACKAGE}.Checkpoints/ResumeRun": RpcRoles(AGENTS_AND_ADMINS),
    f"{PACKAGE}.Checkpoints/ForkRun": RpcRoles(AGENTS_AND_ADMINS),
    f"{PACKAGE}.Checkpoints/ExportCheckpoint": RpcRoles(EVERY_ROLE),
    f"{PACKAGE}.Checkpoints/ImportCheckpoint": RpcRoles(
        AGENTS_AND_ADMINS,
        "An archive that no trusted key signed (allow_unsigned) only by an admin "
        "(UNSIGNED_IMPORT_NEEDS_ADMIN), and only as a new run (UNSIGNED_IMPORT_INTO_EXISTING_RUN).",
    ),
    f"{PACKAGE}.Checkpoints/PutArtifact": RpcRoles(ARTIFACT_WRITERS),
    f"{PACKAGE}.Checkpoints/DeclareArtifact": RpcRoles(ARTIFACT_WRITERS),
    f"{PACKAGE}.Checkpoints/CompleteArtifact": RpcRoles(ARTIFACT_WRITERS),
    f"{PACKAGE}.Checkpoints/DeleteArtifact": RpcRoles(ARTIFACT_WRITERS),
    f"{PACKAGE}.Checkpoints/RecordSnapshot": RpcRoles(AGENTS),
    f"{PACKAGE}.Checkpoints/RecordProviderSession": RpcRoles(AGENTS),
    f"{PACKAGE}.Checkpoints/RecordExecutionHandle": RpcRoles(AGENTS),
    f"{PACKAGE}.Checkpoints/StoreLiveContinuation": RpcRoles(
        NOBODY,
        "Refused for every caller (LIVE_CONTINUATION_NOT_STORABLE): a live continuation is never stored.",
    ),
    # --- Principals ---
    f"{PACKAGE}.Principals/ListPrincipals": RpcRoles(EVERY_ROLE, "A principal that is not an admin sees only itself."),
    f"{PACKAGE}.Principals/DisablePrincipal": RpcRoles(ADMINS, "Never the calling admin itself (CANNOT_DISABLE_SELF)."),
    f"{PACKAGE}.Principals/EnablePrincipal": RpcRoles(ADMINS),
    f"{PACKAGE}.Principals/RotateToken": RpcRoles(
        EVERY_ROLE,
        "Its own token; another principal's token, or a new expiry with it, only by an admin (ROLE_REQUIRED).",
    ),
    f"{PACKAGE}.Principals/SetTokenExpiry": RpcRoles(ADMINS),
    # --- Retention ---
    f"{PACKAGE}.Retention/PutRetentionRule": RpcRoles(ADMINS),
    f"{PACKAGE}.Retention/ListRetentionRules": RpcRoles(EVERY_ROLE),
    f"{PACKAGE}.Retention/PlaceLegalHold": RpcRoles(HOLDERS),
    f"{PACKAGE}.Retention/ReleaseLegalHold": RpcRoles(ADMINS),
    f"{PACKAGE}.Retention/ListLegalHolds": RpcRoles(EVERY_ROLE),
    f"{PACKAGE}.Retention/CollectRetention": RpcRoles(
        ADMINS, "Collects within the caller's tenant only, at most a bounded number of batches per call."
    ),
    # --- Schedules ---
    f"{PACKAGE}.Schedules/ScheduleIntent": RpcRoles(
        AGENTS, "The budget it holds is the tool contract's default estimate, never an amount the caller names."
    ),
    f"{PACKAGE}.Schedules/GetSchedule": RpcRoles(EVERY_ROLE),
    f"{PACKAGE}.Schedules/ListSchedules": RpcRoles(EVERY_ROLE),
    f"{PACKAGE}.Schedules/CancelSchedule": RpcRoles(
        AGENTS | RECONCILING_ROLES,
        "An agent only a schedule it made (SCHEDULE_NOT_OWNED); an operator or an admin any of its tenant.",
    ),
    f"{PACKAGE}.Schedules/WatchDueIntents": RpcRoles(
        EVERY_ROLE, "Each read of the stream authenticates the caller and checks its roles again."
    ),
}


def rpc_name(service: str, method: str) -> str:
    """``("Gate", "GetDecision")`` -> ``effectledger.v1.Gate/GetDecision``, the table's key."""
    return f"{PACKAGE}.{service}/{method}"


def of(service: str, method: str) -> frozenset[Role]:
    """The roles that may call ``service``'s ``method``."""
    return RPC_ROLES[rpc_name(service, method)].roles
