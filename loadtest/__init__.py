"""Load and overhead benchmarks for the gateway (not shipped in the runtime image)."""
