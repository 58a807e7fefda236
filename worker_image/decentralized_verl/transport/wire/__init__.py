"""The wire contract, one module per service; `transport.messages` re-exports all of it."""
