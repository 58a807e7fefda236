"""Pure: a job's children other than its worker pods: the rendered-config ConfigMap, the Services, the
guards (credentials Secret, NetworkPolicies), the gang schedulers' PodGroups and Kueue's pod groups, and
how each is synced when it drifts."""
