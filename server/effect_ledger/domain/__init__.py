"""Pure rules: no protobuf, no gRPC context, no database session. Plain values in, decisions out."""
