{{- define "tessera.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "tessera.labels" -}}
app.kubernetes.io/name: tessera
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- /* The DRA node selector as KEY=VALUE,... for the controller's --dra-node-selector. */ -}}
{{- define "tessera.draSelector" -}}
{{- $pairs := list -}}
{{- range $k, $v := .Values.dra.nodeSelector -}}
{{- $pairs = append $pairs (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{- /* KUBERNETES_SERVICE_HOST/PORT from apiServer.host/port (the client libraries' in-cluster
configuration reads them); included only when apiServer.host is set. */ -}}
{{- define "tessera.apiServerEnv" -}}
- name: KUBERNETES_SERVICE_HOST
  value: {{ .Values.apiServer.host | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ .Values.apiServer.port | default "443" | quote }}
{{- end -}}
