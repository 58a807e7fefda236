"""Kubernetes objects as the operator marks and reads them: the labels and ownerReference every child
carries, a pod's observed state, Kubernetes times and resource quantities. Pure; the bottom room."""
