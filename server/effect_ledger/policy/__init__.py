"""Policy engines behind one interface: embedded Rego (the default) and a remote OPA server."""
