{{/* Labels every object of the chart carries. */}}
{{- define "gpu-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: gpu-operator
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* A full image reference from a map with repository, image and version (version defaults to appVersion). */}}
{{- define "gpu-operator.image" -}}
{{- $version := .values.version | default .root.Chart.AppVersion -}}
{{- if hasPrefix "sha256:" $version -}}
{{ printf "%s/%s@%s" .values.repository .values.image $version }}
{{- else -}}
{{ printf "%s/%s:%s" .values.repository .values.image $version }}
{{- end -}}
{{- end }}

{{/* The operator image (also node-labeler and dra-driver-validator). */}}
{{- define "gpu-operator.operatorImage" -}}
{{ include "gpu-operator.image" (dict "values" .Values.operator "root" .) }}
{{- end }}

{{/* The value of DEFAULT_GPU_ALLOCATION_MODE in operator.env, or "" when unset. */}}
{{- define "gpu-operator.allocationMode" -}}
{{- range .Values.operator.env -}}
{{- if eq .name "DEFAULT_GPU_ALLOCATION_MODE" }}{{ .value | default "" }}{{ end -}}
{{- end -}}
{{- end }}

{{/* True when the apiserver serves resource.k8s.io/v1 DeviceClasses, the only version the operator uses. */}}
{{- define "gpu-operator.draServed" -}}
{{- if .Capabilities.APIVersions.Has "resource.k8s.io/v1/DeviceClass" -}}
true
{{- end -}}
{{- end }}

{{/* Standard hardening of the operator and labeler containers. */}}
{{- define "gpu-operator.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}
