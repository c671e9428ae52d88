{{/* The release's object names: "<release>" when it says dedupq, else "<release>-dedupq". */}}
{{- define "dedupq.fullname" -}}
{{- if contains "dedupq" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-dedupq" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Selects the release's dedupq pods. app.kubernetes.io/name is also the
     ServiceMonitor's job label: job="dedupq", as the alerts select. */}}
{{- define "dedupq.selectorLabels" -}}
app.kubernetes.io/name: dedupq
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dedupq.labels" -}}
{{ include "dedupq.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "dedupq.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Pod and container security: the Dockerfile's numeric user, no root, a read-only root. */}}
{{- define "dedupq.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "dedupq.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}
