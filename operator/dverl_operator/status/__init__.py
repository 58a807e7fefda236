"""A job's `.status`: the conditions and phases the operator writes, the fields it fills from pods and the
coordinator's progress, the outcome of a pass, and the merge patch that writes only what changed. Pure."""
