"""The client's version and the proto package it speaks.

The rule: the major version is the proto package's version (``effectledger.v1`` -> ``1.x.y``);
the minor version grows each time the shipped stubs are regenerated from changed protos; the
patch version for changes of the client alone. ``tests/client/test_generated_stubs.py`` checks
that the major version and the package of every shipped descriptor agree with PROTO_PACKAGE, and
that ``protos/`` is the tree PROTOS_SHA256 records for this minor version.
"""

PROTO_PACKAGE = "effectledger.v1"
__version__ = "1.2.0"

# major.minor -> the SHA-256 of the protos/ tree its stubs were generated from (each .proto file's
# path under protos/, a NUL, its bytes, a NUL, in path order). A change of protos/ fails the test
# until the stubs are regenerated, the minor version is raised and its digest is added here; an
# entry, once a version is out, is never edited.
PROTOS_SHA256 = {
    "1.1": "d50f248e3a0001743bac44271c36d93cafd2898b66f13036420474c4d026e56e",
    "1.2": "c8320a4b45bfb32c966ca921813fb0a722e6a6f9bb455d5b7e52be1abf066061",
}
