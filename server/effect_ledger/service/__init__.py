"""Use cases: each runs inside one unit of work, calls the domain rules and the storage."""
