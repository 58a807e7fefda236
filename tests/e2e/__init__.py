"""Jobs that train end to end, the operator on the test node, chaos and learning runs."""
