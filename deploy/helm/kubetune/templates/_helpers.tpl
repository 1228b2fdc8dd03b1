{{- define "kubetune.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kubetune.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kubetune.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kubetune.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kubetune.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kubetune.image" -}}
{{- printf "%s:%s" .Values.image.repository (default (printf "%s-server" .Chart.AppVersion) .Values.image.tag) -}}
{{- end -}}

{{- define "kubetune.env" -}}
- {name: KUBETUNE_HOME, value: /var/lib/kubetune}
- {name: HOME, value: /tmp}
- {name: HF_HOME, value: /var/lib/kubetune/huggingface}
{{- if eq .Values.database.type "postgresql" }}
- name: KUBETUNE_SERVER_DB
  valueFrom:
    secretKeyRef: {name: {{ .Values.database.postgresql.existingSecret | quote }}, key: {{ .Values.database.postgresql.key | quote }}}
{{- else }}
- {name: KUBETUNE_SERVER_DB, value: "sqlite:////var/lib/kubetune/server.db"}
{{- end }}
{{- with .Values.objectStore.endpoint }}
- {name: AWS_ENDPOINT_URL, value: {{ . | quote }}}
{{- end }}
{{- range $name, $value := .Values.env }}
- {name: {{ $name | quote }}, value: {{ $value | quote }}}
{{- end }}
{{- end -}}

{{- define "kubetune.volumeMounts" -}}
- {name: config, mountPath: /etc/kubetune/server, readOnly: true}
- {name: state, mountPath: /var/lib/kubetune}
- {name: tmp, mountPath: /tmp}
{{- end -}}
