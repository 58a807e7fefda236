{{/* Chart name, overridable. */}}
{{- define "dverl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified release name, truncated to 63 characters (the DNS label limit some fields have).
A release named like the chart is not doubled ("dverl", not "dverl-dverl").
*/}}
{{- define "dverl.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "dverl.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object the chart renders. */}}
{{- define "dverl.labels" -}}
helm.sh/chart: {{ include "dverl.chart" . }}
{{ include "dverl.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels that select the operator pods: stable across upgrades, so never the version. */}}
{{- define "dverl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dverl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The Secret the operator keeps its identity (CA and key) in, in the release namespace. */}}
{{- define "dverl.identitySecretName" -}}
{{- printf "%s-identity" (include "dverl.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "dverl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dverl.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag, the tag defaulting to the chart's appVersion. Call with an image values dict and $. */}}
{{- define "dverl.imageRef" -}}
{{- $image := index . 0 }}
{{- $root := index . 1 }}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) }}
{{- end }}

{{/*
The rules the operator needs inside each namespace it watches (a ClusterRole's rules when it watches
all of them). Every verb list is the smallest that the reconcile loop uses; no wildcards.
*/}}
{{- define "dverl.namespacedRules" -}}
# RLHFJobs: kopf lists/watches them and patches metadata (finalizers, its handled-state annotation);
# each pass reads its job (get). Never create/delete: users own their jobs; never update: all writes patch.
- apiGroups: ["dverl.io"]
  resources: ["rlhfjobs"]
  verbs: ["get", "list", "watch", "patch"]
# RLHFJob status: the operator is the only writer of .status (phase, conditions, progress columns), by
# merge patch of the status subresource; it reads status with the job itself.
- apiGroups: ["dverl.io"]
  resources: ["rlhfjobs/status"]
  verbs: ["patch"]
# Worker pods, one per planned worker: listed by the job's label and watched (kopf) for health, created,
# annotated (patch: a failure counted once, a Kueue group finished), removed on failure, scale or suspend.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["create", "delete", "list", "watch", "patch"]
# Per-job headless Service (worker discovery), volunteer gateway Service and rendered job ConfigMap: read
# by name to see drift, created, patched back, removed when unwanted. Never listed or watched.
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["create", "get", "patch", "delete"]
# Events on RLHFJobs (refusals, failures, restarts) so `kubectl describe rlhfjob` explains them; each is
# a new Event, never an update of one.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# The watched namespace itself, read by name for its pod-security.kubernetes.io/enforce label: a job that
# declares more than the namespace admits (spec.podSecurity) is refused before any pod is sent. In a Role
# this reaches only the Role's own namespace (the API server files a namespace's GET under that namespace).
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get"]
# Each job's credentials Secret: created once (a 409 means it exists). Nothing else: it is owned by its
# RLHFJob, so the garbage collector (not the operator) deletes it with the job, and it is never read,
# listed or watched (the operator derives what it needs from its own identity). Kubernetes cannot limit
# create to names, so create is the one unnamed Secret verb.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
{{- if .Values.networkPolicy.enabled }}
# Each job's NetworkPolicies: created, read back to restore a hand-edited spec, removed when unwanted.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["create", "get", "patch", "delete"]
{{- end }}
{{- if .Values.gangScheduling.coscheduling }}
# Gang PodGroups of scheduler-plugins coscheduling: one per job, made, read back, resized, removed on suspend.
- apiGroups: ["scheduling.x-k8s.io"]
  resources: ["podgroups"]
  verbs: ["create", "get", "patch", "delete"]
{{- end }}
{{- if .Values.gangScheduling.volcano }}
# Gang PodGroups of Volcano: one per job, made, read back, resized, removed on suspend.
- apiGroups: ["scheduling.volcano.sh"]
  resources: ["podgroups"]
  verbs: ["create", "get", "patch", "delete"]
{{- end }}
{{- with .Values.volunteers.joinTokenSecretNames }}
# Volunteer join tokens: read-only, and only the Secrets named in values (never list/watch all secrets).
- apiGroups: [""]
  resources: ["secrets"]
  resourceNames: {{ toJson . }}
  verbs: ["get"]
{{- end }}
{{- end }}

{{/* The gang schedulers whose PodGroups the operator manages, comma-separated (DVERL_GANG_SCHEDULERS). */}}
{{- define "dverl.gangSchedulers" -}}
{{- $on := list -}}
{{- if .Values.gangScheduling.coscheduling }}{{- $on = append $on "coscheduling" -}}{{- end -}}
{{- if .Values.gangScheduling.volcano }}{{- $on = append $on "volcano" -}}{{- end -}}
{{- join "," $on -}}
{{- end }}

{{/* A label map as k=v,k2=v2 (sorted), what the operator's label flags read; an empty map is "". */}}
{{- define "dverl.labelPairs" -}}
{{- $pairs := list -}}
{{- range $key, $value := (. | default dict) -}}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}
