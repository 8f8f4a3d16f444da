"""Developer tools that ship with the package (code generation)."""
