"""One RLHFJob's reconcile loop, its I/O side: read the job and its children, ask the pure `decide`,
apply what it returns (children, Events, the job's credentials, `.status`), poll the coordinator for
progress, and decide how long to wait after a pass that failed."""
