{{/* The chart name, overridable. */}}
{{- define "dispatch-kubeflow.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The full name of the release's resources. */}}
{{- define "dispatch-kubeflow.fullname" -}}
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

{{- define "dispatch-kubeflow.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "dispatch-kubeflow.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dispatch-kubeflow.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Each Deployment selects its own pods only: the component label keeps the operator's selector from
matching the admission controller's pods (and the reverse).
*/}}
{{- define "dispatch-kubeflow.operatorSelectorLabels" -}}
{{ include "dispatch-kubeflow.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "dispatch-kubeflow.admissionSelectorLabels" -}}
{{ include "dispatch-kubeflow.selectorLabels" . }}
app.kubernetes.io/component: admission
{{- end }}

{{/* The namespace of dispatch-admission's Lease: admission.lease.namespace, else the release's. */}}
{{- define "dispatch-kubeflow.admissionLeaseNamespace" -}}
{{- default .Release.Namespace .Values.admission.lease.namespace }}
{{- end }}

{{- define "dispatch-kubeflow.labels" -}}
helm.sh/chart: {{ include "dispatch-kubeflow.chart" . }}
{{ include "dispatch-kubeflow.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The ServiceAccount the operator runs as. */}}
{{- define "dispatch-kubeflow.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dispatch-kubeflow.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image, by digest when one is given. */}}
{{- define "dispatch-kubeflow.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}
