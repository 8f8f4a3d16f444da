"""The client's version and the proto package it speaks.

The rule: the major version is the proto package's version (``effectledger.v1`` -> ``1.x.y``);
the minor version grows each time the shipped stubs are regenerated from changed protos; the
patch version for changes of the client alone. ``tests/client/test_generated_stubs.py`` checks
that the major version and the package of every shipped descriptor agree with PROTO_PACKAGE.
"""

PROTO_PACKAGE = "effectledger.v1"
__version__ = "1.0.0"
