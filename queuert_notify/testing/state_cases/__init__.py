"""The state-adapter conformance cases, one module per area of the contract."""
