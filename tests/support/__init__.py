"""What the tests share: helpers, the test node (`node_harness`), workers run as scripts, data files."""
