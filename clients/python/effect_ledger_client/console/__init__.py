"""The reviewer's web console: approvals, runs, effects needing a human, budgets, decisions.

It speaks to the gate over gRPC with the signed-in principal's token and has no database of
its own: ``effect-ledger-console --server HOST:PORT`` (docs/console.md).
"""
