{{- define "kubetune-job.fullname" -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "kubetune-job.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kubetune-job.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (printf "%s-launcher" (include "kubetune-job.fullname" .)) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* A file's ConfigMap key: its relative path with / as __ (keys cannot hold /); mounted back at the path. */}}
{{- define "kubetune-job.fileKey" -}}
{{- . | replace "/" "__" -}}
{{- end -}}
