"""Every reason code the service answers with: the catalog docs/errors.md is generated from.

Two kinds, two tables:

- ``ERROR_REASONS``: the ``reason`` of a refused call (``google.rpc.ErrorInfo.reason``, and
  ``LedgerError.reason`` in Python). Each names the error class it is raised as, whose gRPC
  status comes from the one class-to-status table (``transport/status.py``), whether
  retrying the same call can help, and what a caller should do.
- ``DECISION_REASONS``: the ``reasons`` of a decision (``AuthorizeEffectResponse.reasons``,
  ``Decision.reasons``): why the gate answered ALLOW, DENY, REQUIRE_APPROVAL, DUPLICATE or
  RECONCILE_REQUIRED, from the service's own rules or from the shipped Rego policy.

A code can be in both (TOOL_UNKNOWN refuses RequestApproval and is a reason to DENY an
AuthorizeEffect). ``tests/unit/test_reason_catalog.py`` reads the source tree and the policy
and fails on a code used there that is missing here, or listed here and used nowhere.
Regenerate the document with ``python -m effect_ledger.tools.gendocs``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from effect_ledger import errors
from effect_ledger.domain.model import Outcome


class Retry(enum.Enum):
    """Whether the same call, sent again unchanged, can succeed."""

    NO = "no"  # it fails the same way: change the request, the caller or the ledger's facts
    YES = "yes"  # a passing condition: retry after RetryInfo's delay (or a backoff)
    AFTER_FIX = "after the fix"  # once what "What to do" names is done, the same call succeeds


@dataclass(frozen=True)
class ErrorReason:
    code: str
    # The class it is raised as (its gRPC status: transport/status.py); None: not a domain
    # error, the INTERNAL status of anything unmapped.
    error: type[errors.LedgerError] | None
    retry: Retry
    action: str


def _errors(error: type[errors.LedgerError], retry: Retry, *rows: tuple[str, str]) -> list[ErrorReason]:
    return [ErrorReason(code, error, retry, action) for code, action in rows]


_FIX_REQUEST = "Fix the field the BadRequest detail names."

ERROR_REASONS: tuple[ErrorReason, ...] = tuple(
    sorted(
        [
            # --- INVALID_ARGUMENT: the request itself is wrong -------------------------------
            *_errors(
                errors.InvalidArgument,
                Retry.NO,
                ("INVALID_ARGUMENT", _FIX_REQUEST),
                ("FIELD_REQUIRED", "Set the required field the BadRequest detail names."),
                ("INVALID_ID", "Use 1 to 256 printable ASCII characters without spaces for the identifier."),
                ("INVALID_TOOL_NAME", "Use a tool name matching `[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}`."),
                ("TOO_LONG", "Shorten the text field to the length the message states."),
                ("CONTROL_CHARACTER", "Remove control characters from the text field."),
                ("INVALID_ENUM", "Send one of the enum's defined values."),
                ("INVALID_TIMESTAMP", "Send a timestamp between the years 1 and 9999."),
                ("INVALID_RANGE", "Make `created_before` later than `created_after`."),
                ("INVALID_PAGE_SIZE", "Ask for a `page_size` between 0 and the maximum the message states."),
                ("INVALID_PAGE_TOKEN", "Send back a `next_page_token` exactly as this service issued it."),
                ("TOO_MANY_VALUES", "Send fewer values in the repeated filter field."),
                ("INVALID_LABEL", "Use label keys of 1 to 63 characters."),
                ("TOO_MANY_LABELS", "Send at most 32 labels."),
                ("INVALID_TTL", "Ask for an approval `ttl_seconds` between 0 (the default) and the server's maximum."),
                ("INVALID_EXPIRY", "Give a token expiry between 1 second and 10 years from now."),
                ("SCHEDULE_TIME_REQUIRED", "Give either `not_before` or `delay_seconds` (one of the two)."),
                (
                    "SCHEDULE_TIME_INVALID",
                    "Schedule at most 400 days ahead, with a deadline after `not_before` that has not passed.",
                ),
                ("JSON_REQUIRED", "Send the JSON field; it may not be empty."),
                ("JSON_TOO_LARGE", "Send at most the bytes the message states (64 KiB by default)."),
                ("JSON_INVALID_UTF8", "Encode the JSON as UTF-8."),
                (
                    "JSON_INVALID",
                    "Send valid JSON: no duplicate keys, NaN or Infinity, and only numbers a double holds exactly.",
                ),
                ("JSON_NOT_OBJECT", "Send a JSON object ({...}), not another JSON value."),
                ("JSON_TOO_DEEP", "Nest the JSON at most 32 levels deep."),
                (
                    "ARGUMENTS_SCHEMA_VIOLATION",
                    "Make the arguments satisfy the tool contract's arguments schema; BadRequest names each violation.",
                ),
                (
                    "ARGUMENTS_CHECK_TOO_COSTLY",
                    "Send arguments the schema can be checked against in fewer steps, or register a simpler schema.",
                ),
                ("INVALID_TOOL_CONTRACT", "Fix the contract fields BadRequest names, then put it again."),
                ("INVALID_DIMENSION", "Name budget dimensions with `[a-z][a-z0-9_]{0,63}`."),
                ("NEGATIVE_AMOUNT", "Send amounts of zero or more."),
                ("AMOUNT_OVERFLOW", "Send smaller amounts: the sum must fit a signed 64-bit integer."),
                ("TOO_MANY_DIMENSIONS", "Name fewer dimensions in the estimate or usage."),
                ("TOO_MANY", "Send fewer entries in the list the BadRequest detail names."),
                ("TOO_MANY_ARTIFACTS", "Reference fewer artifacts in one checkpoint."),
                ("INVALID_ARTIFACT", "Give each artifact a unique relative name without `..`."),
                ("INVALID_DIGEST", "Write digests as `sha256:<64 lowercase hex digits>`."),
                ("TOO_LARGE", "Declare the artifact (DeclareArtifact) instead of putting its content."),
                ("CREDENTIALS_REFUSED", "Give the artifact's location without credentials in it."),
                ("ARCHIVE_INVALID", "Send the archive ExportCheckpoint produced, unaltered and in one stream."),
                ("KEY_INVALID", "Give an unencrypted Ed25519 key in PEM form."),
                (
                    "INVALID_MAX_AGE",
                    "Give a retention `max_age_seconds` of 0 (keep forever) or within the bounds the message states.",
                ),
            ),
            # --- UNAUTHENTICATED: who is calling is not known -------------------------------
            *_errors(
                errors.Unauthenticated,
                Retry.NO,
                ("UNAUTHENTICATED", "Authenticate with a valid bearer token."),
                ("TOKEN_MISSING", "Send the metadata 'authorization: Bearer <token>' on every call."),
                (
                    "TOKEN_UNKNOWN",
                    "Use a current token: this one is unknown, rotated, expired, or its principal is disabled.",
                ),
                (
                    "CLIENT_CERTIFICATE_MISMATCH",
                    "Call over mTLS with the client certificate whose subject the token is bound to.",
                ),
            ),
            # --- PERMISSION_DENIED: the caller may not do this ------------------------------
            *_errors(
                errors.PermissionDenied,
                Retry.NO,
                ("PERMISSION_DENIED", "Call as a principal with the authority the message names."),
                ("ROLE_REQUIRED", "Call as a principal holding one of the RPC's roles (docs/api.md)."),
                (
                    "SCHEDULE_NOT_OWNED",
                    "Cancel a schedule as the agent that made it, or as an operator or an admin.",
                ),
                (
                    "ATTEMPT_NOT_OWNED",
                    "Act on an attempt as the principal that was allowed it, or as an operator or an admin.",
                ),
                (
                    "RECONCILE_NEEDS_OPERATOR",
                    "Have an operator or an admin that is not the attempt's principal settle it as `not_happened`.",
                ),
                (
                    "LOOKUP_EVIDENCE_REQUIRED",
                    "Settle as `not_happened` with the provider lookup's `lookup_reference` and `lookup_result_json`.",
                ),
                ("SELF_APPROVAL", "Have another reviewer or admin decide: the requester cannot."),
                (
                    "UNSIGNED_IMPORT_NEEDS_ADMIN",
                    "Import an archive no trusted key signed as an admin, or sign it with a trusted key.",
                ),
                (
                    "POLICY_DENIED",
                    "Read the decision (metadata `decision_id`): the reconcile policy refused without a reason.",
                ),
                (
                    "INPUT_MALFORMED",
                    "Report it: the reconcile policy found its input malformed (the decision is recorded).",
                ),
                ("EVIDENCE_UNKNOWN", "Settle with a `receipt` or `not_happened` evidence."),
                (
                    "NO_RULE_MATCHED",
                    "Read the decision (metadata `decision_id`): no rule of the reconcile policy allowed it.",
                ),
            ),
            # --- NOT_FOUND: absent, or another tenant's -------------------------------------
            *_errors(
                errors.NotFound,
                Retry.NO,
                ("NOT_FOUND", "Check the identifier: it names nothing of the caller's tenant."),
                ("RUN_NOT_FOUND", "Check run_id, or create the run first (CreateRun)."),
                ("EFFECT_NOT_FOUND", "Check effect_id: it names no effect of the caller's tenant."),
                ("ATTEMPT_NOT_FOUND", "Check attempt_id: it names no attempt of the caller's tenant."),
                ("DECISION_NOT_FOUND", "Check decision_id: it names no decision of the caller's tenant."),
                ("APPROVAL_NOT_FOUND", "Check approval_id: it names no approval of the caller's tenant."),
                ("TOOL_NOT_FOUND", "Register the tool's contract first (PutToolContract), or check the revision."),
                ("BUDGET_NOT_FOUND", "Put the budget first (PutBudget), or check its scope and scope_id."),
                ("PRINCIPAL_NOT_FOUND", "Check principal_id: it names no principal of the caller's tenant."),
                ("CHECKPOINT_NOT_FOUND", "Check checkpoint_id: it names no checkpoint of the caller's tenant."),
                ("ARTIFACT_NOT_FOUND", "Put or declare the artifact first, or check its digest."),
                ("LEGAL_HOLD_NOT_FOUND", "Check run_id: the run has never been held (PlaceLegalHold)."),
                (
                    "REMOVED_BY_RETENTION",
                    "Nothing to retry: retention removed it (metadata: kind, removed_at, rule_max_age_seconds, "
                    "tombstone_id, material_digest). Keep it longer with a legal hold or a longer rule next time.",
                ),
                ("SCHEDULE_NOT_FOUND", "Check schedule_id: it names no schedule of the caller's tenant."),
            ),
            # --- ALREADY_EXISTS -------------------------------------------------------------
            *_errors(
                errors.AlreadyExists,
                Retry.NO,
                ("ALREADY_EXISTS", "Read the existing record instead of creating it again."),
            ),
            # --- FAILED_PRECONDITION: the ledger's state forbids it -------------------------
            *_errors(
                errors.FailedPrecondition,
                Retry.NO,
                ("FAILED_PRECONDITION", "Read the PreconditionFailure detail; the ledger's state forbids the call."),
                (
                    "IDEMPOTENCY_KEY_REUSED",
                    "Use a new idempotency key for a new intent; the key stays bound to its first tool, target "
                    "and arguments.",
                ),
                (
                    "RECONCILE_REQUIRED",
                    "Do not report on it again: settle the UNKNOWN effect with ReconcileEffect and evidence.",
                ),
                ("LEASE_EXPIRED", "Do not send the effect: the attempt is UNKNOWN now; reconcile it."),
                ("ATTEMPT_NOT_OPEN", "Do not send the effect: read it (GetEffect) and reconcile if it is UNKNOWN."),
                ("ATTEMPT_SETTLED", "Do not send the effect again: the attempt is settled."),
                ("ATTEMPT_RELEASED", "Do not send the effect: the attempt was given back; authorize again."),
                ("ATTEMPT_NOT_RELEASABLE", "Release only an AUTHORIZED attempt; report what happened instead."),
                (
                    "DISPATCH_RECORDED",
                    "Report FAILED with PROVIDER_REJECTED evidence, or UNKNOWN: a recorded dispatch is not NOT_SENT.",
                ),
                (
                    "CONFLICTING_OUTCOME",
                    "Investigate: another outcome was recorded first; both reports are kept in the run's trace.",
                ),
                ("DECISION_NOT_REPLAYABLE", "Replay a decision that recorded its policy input."),
                ("APPROVAL_NOT_PENDING", "Request a new approval: this one was already decided, used or revoked."),
                ("APPROVAL_EXPIRED", "Request a new approval: this one expired."),
                ("ALREADY_DECIDED", "Nothing to do: this reviewer's vote is recorded."),
                ("CANNOT_DISABLE_SELF", "Have another admin disable this principal."),
                (
                    "REVISION_MISMATCH",
                    "Read the tool's current contract and put it again with its revision as `expected_revision`.",
                ),
                ("REVISION_MOVED", "Seal again at the run's current revision (metadata `current_revision`)."),
                ("ALREADY_REGISTERED", "Nothing to register: the checkpoint is frozen with other facts."),
                ("FORMAT_NOT_CURRENT", "Import the archive again: import derives a checkpoint of the current format."),
                ("OWNERSHIP_MISMATCH", "Register only checkpoints of the caller's tenant and their own run."),
                ("DIGEST_MISMATCH", "Seal or import the checkpoint again: a component does not match its digest."),
                ("POLICY_IDENTITY_MISSING", "Seal the checkpoint again under a loaded policy."),
                ("NOT_REGISTERED", "Register the checkpoint (RegisterCheckpoint) before forking from it."),
                ("ARTIFACT_DELETED", "Put the artifact's content again (PutArtifact)."),
                (
                    "LIVE_CONTINUATION_NOT_STORABLE",
                    "Seal a checkpoint instead: a live continuation holds process-local values.",
                ),
                (
                    "UNSIGNED_IMPORT_INTO_EXISTING_RUN",
                    "Import an archive that no trusted key signed only as a new run.",
                ),
                ("TOOL_RETIRED", "Use another tool: a retired one is never approved or authorized."),
                (
                    "EFFECT_ALREADY_SUCCEEDED",
                    "Nothing to reconsider: the key's effect SUCCEEDED (AuthorizeEffect answers DUPLICATE).",
                ),
                (
                    "SCHEDULE_EXISTS",
                    "Cancel the key's open schedule (metadata `schedule_id`) first, or wait for it.",
                ),
                ("SCHEDULE_CLOSED", "Read the schedule: it was consumed, cancelled or expired already."),
            ),
            *_errors(
                errors.FailedPrecondition,
                Retry.AFTER_FIX,
                (
                    "RECONCILE_TOO_EARLY",
                    "Wait until `settle_after` (metadata): until then only the attempt's principal may say "
                    "`not_happened`.",
                ),
                ("TOOL_UNKNOWN", "Have an admin register the tool's contract (PutToolContract)."),
                (
                    "BUDGET_EXHAUSTED",
                    "Schedule without holding budget, or after budget is released or raised (ScheduleIntent).",
                ),
                (
                    "ARGUMENTS_SCHEMA_UNUSABLE",
                    "Have an admin register a new contract revision whose arguments schema the service can use.",
                ),
                ("ARTIFACT_INCOMPLETE", "Complete the artifact (CompleteArtifact) before a checkpoint claims it."),
                (
                    "CHECKPOINT_INCOMPATIBLE",
                    "Resume under facts the checkpoint is compatible with (CheckResumeCompatibility lists them).",
                ),
                (
                    "CHECKPOINT_UNSIGNED",
                    "Import an archive signed by a trusted key, or as an admin with `allow_unsigned`, as a new run.",
                ),
                (
                    "CHECKPOINT_SIGNER_UNKNOWN",
                    "Trust the signer's key (effect-ledger checkpoint-keys trust), or import as an admin with "
                    "`allow_unsigned`, as a new run.",
                ),
                ("ARCHIVE_REFUSED", "Read the PreconditionFailure detail: the archive's component is refused."),
            ),
            # --- UNAVAILABLE: fail closed; nothing was decided -------------------------------
            *_errors(
                errors.Unavailable,
                Retry.YES,
                ("UNAVAILABLE", "Retry after RetryInfo's delay."),
                (
                    "ARGUMENTS_CHECK_UNAVAILABLE",
                    "Retry after RetryInfo's delay: the arguments could not be checked against the schema.",
                ),
            ),
            *_errors(
                errors.PolicyUnavailable,
                Retry.YES,
                (
                    "POLICY_UNAVAILABLE",
                    "Retry after RetryInfo's delay: the policy engine did not answer; the gate failed closed.",
                ),
            ),
            *_errors(
                errors.PolicyUnavailable,
                Retry.AFTER_FIX,
                (
                    "POLICY_UNDEFINED",
                    "Report it to the operators: the policy gave no valid decision; the gate fails closed until "
                    "the policy is fixed.",
                ),
            ),
            *_errors(
                errors.StorageUnavailable,
                Retry.YES,
                (
                    "STORAGE_UNAVAILABLE",
                    "Retry after RetryInfo's delay: the database did not answer; nothing was written.",
                ),
            ),
            *_errors(
                errors.CommitOutcomeUnknown,
                Retry.YES,
                (
                    "COMMIT_OUTCOME_UNKNOWN",
                    "Retry with the same idempotency key: the write may have landed, and the ledger answers "
                    "from what was committed.",
                ),
            ),
            # --- ABORTED, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED -----------------------------
            *_errors(
                errors.Conflict,
                Retry.YES,
                ("CONCURRENT_UPDATE", "Retry: a concurrent request won a race the service already retried."),
            ),
            *_errors(
                errors.DeadlineExceeded,
                Retry.YES,
                (
                    "DEADLINE_EXCEEDED",
                    "Retry with the same idempotency key, or read first: the call may have taken effect.",
                ),
            ),
            *_errors(
                errors.ResourceExhausted,
                Retry.YES,
                ("RESOURCE_EXHAUSTED", "Retry after RetryInfo's delay."),
                ("RATE_LIMITED", "Slow down: retry after RetryInfo's delay (per-token request rate)."),
                ("SERVER_BUSY", "Retry after RetryInfo's delay: the server process runs its maximum of calls."),
                ("STREAMS_EXHAUSTED", "Close another stream of this principal, or retry after RetryInfo's delay."),
                (
                    "TENANT_BUSY",
                    "Retry after RetryInfo's delay: the tenant runs its maximum of calls (or of WatchApprovals "
                    "streams) on the server process.",
                ),
                (
                    "WATCHERS_EXHAUSTED",
                    "Retry WatchApprovals later: the server process holds its maximum of streams.",
                ),
            ),
            *_errors(
                errors.ResourceExhausted,
                Retry.AFTER_FIX,
                (
                    "QUOTA_EXCEEDED",
                    "Free some of the tenant's quota the QuotaFailure detail names (the message says how).",
                ),
            ),
            ErrorReason(
                "INTERNAL",
                None,
                Retry.NO,
                "Report it with the call's request id: the server logged the trace; the message is generic.",
            ),
        ],
        key=lambda reason: reason.code,
    )
)


class Source(enum.Enum):
    """Who gives a decision reason."""

    GATE_SERVICE = "service (AuthorizeEffect)"
    RECONCILE_SERVICE = "service (ReconcileEffect)"
    GATE_POLICY = "policy effectledger.gate"
    RECONCILE_POLICY = "policy effectledger.reconcile"

    @property
    def policy_package(self) -> str | None:
        """The Rego package that gives the reason, or None for the service's own rules."""
        return {
            Source.GATE_POLICY: "effectledger.gate",
            Source.RECONCILE_POLICY: "effectledger.reconcile",
        }.get(self)


@dataclass(frozen=True)
class DecisionReason:
    code: str
    outcome: Outcome
    sources: tuple[Source, ...]
    action: str


_GATE = (Source.GATE_SERVICE,)
_BOTH_GATES = (Source.GATE_SERVICE, Source.GATE_POLICY)
_REFUSED_SETTLE = "The call fails with the same reason."

DECISION_REASONS: tuple[DecisionReason, ...] = tuple(
    sorted(
        [
            # --- the ledger's own verdict on the idempotency key ----------------------------
            DecisionReason(
                "EFFECT_SUCCEEDED",
                Outcome.DUPLICATE,
                _GATE,
                "Do not send: the effect already happened; the response carries its receipt.",
            ),
            DecisionReason(
                "EFFECT_SETTLED_IN_PARENT",
                Outcome.DUPLICATE,
                _GATE,
                "Do not send: a run this one was forked or resumed from already did it.",
            ),
            DecisionReason(
                "EFFECT_AUTHORIZED",
                Outcome.RECONCILE_REQUIRED,
                _GATE,
                "Do not send: an attempt is authorized and may still be sent; reconcile it first.",
            ),
            DecisionReason(
                "EFFECT_DISPATCHED",
                Outcome.RECONCILE_REQUIRED,
                _GATE,
                "Do not send: an attempt was dispatched; reconcile it with the provider's answer first.",
            ),
            DecisionReason(
                "EFFECT_UNKNOWN",
                Outcome.RECONCILE_REQUIRED,
                _GATE,
                "Do not send: an attempt's outcome is unknown; reconcile it with evidence first.",
            ),
            DecisionReason(
                "EFFECT_OPEN_IN_PARENT",
                Outcome.RECONCILE_REQUIRED,
                _GATE,
                "Do not send: a run this one came from has the effect open; reconcile it there first.",
            ),
            DecisionReason(
                "EFFECT_FAILED",
                Outcome.ALLOW,
                _GATE,
                "Send: a new attempt after a definite failure, with a fresh provider key.",
            ),
            DecisionReason(
                "EFFECT_RELEASED",
                Outcome.ALLOW,
                _GATE,
                "Send: a new attempt after one that was given back unsent.",
            ),
            DecisionReason(
                "RETRY_SAME_KEY",
                Outcome.ALLOW,
                _GATE,
                "Send again with the same provider idempotency key: the provider deduplicates.",
            ),
            DecisionReason(
                "RETRY_LIMIT_EXCEEDED",
                Outcome.DENY,
                _GATE,
                "Stop: the contract's `max_attempts` were used; settle by hand.",
            ),
            DecisionReason(
                "IDEMPOTENCY_KEY_REUSED",
                Outcome.DENY,
                _GATE,
                "Use a new key for a new intent (the call fails with FAILED_PRECONDITION, this decision recorded).",
            ),
            # --- the contract and the run ---------------------------------------------------
            DecisionReason(
                "TOOL_UNKNOWN",
                Outcome.DENY,
                _BOTH_GATES,
                "Have an admin register the tool's contract.",
            ),
            DecisionReason(
                "TOOL_RETIRED",
                Outcome.DENY,
                _BOTH_GATES,
                "Use another tool: a retired one is never authorized.",
            ),
            DecisionReason(
                "CONTRACT_MISSING",
                Outcome.DENY,
                _GATE,
                "Report it: the contract revision the effect is pinned to is missing.",
            ),
            DecisionReason(
                "LIVE_TOOL_IN_SIMULATED_WORLD",
                Outcome.DENY,
                _BOTH_GATES,
                "Use a simulator tool: a simulated run never reaches a live tool.",
            ),
            DecisionReason(
                "SIMULATOR_IN_LIVE_WORLD",
                Outcome.DENY,
                _BOTH_GATES,
                "Use the live tool: a simulator cannot act for a live run.",
            ),
            DecisionReason(
                "SCHEDULE_NOT_DUE",
                Outcome.DENY,
                _GATE,
                "Wait for the key's scheduled intent to be due (WatchDueIntents), or cancel it (CancelSchedule).",
            ),
            DecisionReason(
                "RECONCILE_AFTER_RESUME",
                Outcome.DENY,
                _BOTH_GATES,
                "Reconcile the effects open at the resume (the message lists them), then authorize.",
            ),
            # --- approvals and budgets -------------------------------------------------------
            DecisionReason(
                "IRREVERSIBLE_TOOL",
                Outcome.REQUIRE_APPROVAL,
                (Source.GATE_POLICY,),
                "Wait for a reviewer's approval (`approval_request_id`), then authorize again with the same key.",
            ),
            DecisionReason(
                "APPROVAL_DENIED",
                Outcome.DENY,
                _BOTH_GATES,
                "Stop, or request a new approval: a reviewer denied this intent.",
            ),
            DecisionReason(
                "APPROVAL_INVALID",
                Outcome.DENY,
                _GATE,
                "Authorize again: the approval policy relied on no longer binds the intent (reasons after it say why).",
            ),
            DecisionReason(
                "APPROVAL_NOT_FOUND",
                Outcome.DENY,
                _GATE,
                "Request a new approval: the one relied on is gone.",
            ),
            DecisionReason(
                "APPROVAL_NOT_BOUND_TO_INTENT",
                Outcome.DENY,
                _GATE,
                "Request an approval for this run, tool revision, target and arguments.",
            ),
            DecisionReason(
                "APPROVAL_USED",
                Outcome.DENY,
                _GATE,
                "Request a new approval: this one was used up.",
            ),
            DecisionReason(
                "APPROVAL_PENDING",
                Outcome.DENY,
                _GATE,
                "Wait for the reviewers' decision.",
            ),
            DecisionReason(
                "APPROVAL_REVOKED",
                Outcome.DENY,
                _GATE,
                "Request a new approval: this one was revoked.",
            ),
            DecisionReason(
                "APPROVAL_EXPIRED",
                Outcome.DENY,
                _GATE,
                "Request a new approval: this one expired.",
            ),
            DecisionReason(
                "APPROVED_BY_EXECUTOR",
                Outcome.DENY,
                _GATE,
                "Have another principal approve: an approval never counts for an effect its approver executes.",
            ),
            DecisionReason(
                "APPROVAL_QUORUM_NOT_MET",
                Outcome.DENY,
                _GATE,
                "Wait for more reviewers with current authority to approve.",
            ),
            DecisionReason(
                "BUDGET_EXHAUSTED",
                Outcome.DENY,
                _BOTH_GATES,
                "Stop, or have an admin raise the budget (the message names the dimension).",
            ),
            # --- the gate policy's own rules ------------------------------------------------
            DecisionReason(
                "ROLE_NOT_AGENT",
                Outcome.DENY,
                (Source.GATE_POLICY,),
                "Authorize as a principal with the agent role.",
            ),
            DecisionReason(
                "TARGET_HAS_UNKNOWN_EFFECT",
                Outcome.DENY,
                (Source.GATE_POLICY,),
                "Reconcile the UNKNOWN effect of the same tool on this target (the message names it) first.",
            ),
            DecisionReason(
                "CLOCK_MISSING",
                Outcome.DENY,
                (Source.GATE_POLICY,),
                "Report it: the decision time in the policy input is missing or malformed.",
            ),
            DecisionReason(
                "INPUT_MALFORMED",
                Outcome.DENY,
                (Source.GATE_POLICY, Source.RECONCILE_POLICY),
                "Report it: a fact the policy relies on is missing or has the wrong type.",
            ),
            DecisionReason(
                "NO_RULE_MATCHED",
                Outcome.DENY,
                (Source.GATE_POLICY, Source.RECONCILE_POLICY),
                "Report it: no rule of the policy decided, so it failed closed.",
            ),
            # --- ReconcileEffect's decisions ------------------------------------------------
            DecisionReason(
                "EVIDENCE_UNKNOWN",
                Outcome.DENY,
                (Source.RECONCILE_POLICY,),
                "Settle with a `receipt` or `not_happened` evidence.",
            ),
            DecisionReason(
                "LOOKUP_EVIDENCE_REQUIRED",
                Outcome.DENY,
                (Source.RECONCILE_SERVICE, Source.RECONCILE_POLICY),
                "Settle with the provider lookup's reference and result. " + _REFUSED_SETTLE,
            ),
            DecisionReason(
                "ATTEMPT_NOT_OWNED",
                Outcome.DENY,
                (Source.RECONCILE_SERVICE,),
                "Settle as the attempts' principal, or as an operator or an admin. " + _REFUSED_SETTLE,
            ),
            DecisionReason(
                "RECONCILE_NEEDS_OPERATOR",
                Outcome.DENY,
                (Source.RECONCILE_SERVICE,),
                "Have an operator or an admin that is not the attempt's principal settle it. " + _REFUSED_SETTLE,
            ),
            DecisionReason(
                "RECONCILE_TOO_EARLY",
                Outcome.DENY,
                (Source.RECONCILE_SERVICE,),
                "Wait until `settle_after`. " + _REFUSED_SETTLE,
            ),
        ],
        key=lambda reason: reason.code,
    )
)

ERRORS_BY_CODE: dict[str, ErrorReason] = {reason.code: reason for reason in ERROR_REASONS}
DECISIONS_BY_CODE: dict[str, DecisionReason] = {reason.code: reason for reason in DECISION_REASONS}
