"""Pure: a job's worker pods: how one is built (security settings, sources, the role's podTemplate, the
schedulers' marks), the Pod Security Standards it is checked against, and which pods to create or delete
now (scale, failures with backoff, disruptions, gangs)."""
