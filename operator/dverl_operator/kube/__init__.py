"""The Kubernetes API, as the operator uses it: the verbs over every kind it touches (lightkube's async
client with generic, dict-shaped resources), its credentials, and the errors a caller can act on. Every
call the operator makes to the API server goes through here (kopf's own watches aside)."""
