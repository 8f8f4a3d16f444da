"""gRPC transport: servicers, the error table, interceptors and the server itself."""
