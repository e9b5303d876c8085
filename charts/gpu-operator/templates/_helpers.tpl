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

{{/*
The operator and node-labeler Deployments: same hardening, probes, scheduling and operator.env.
Takes root, name (also the ServiceAccount), component, command, replicas, resources, namespaceEnv
(the env var that gets the pod's namespace) and extraEnv (YAML list of env entries, may be empty).
*/}}
{{- define "gpu-operator.controllerDeployment" -}}
{{- $root := .root }}
{{- $v := .root.Values }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpu-operator.labels" $root | nindent 4 }}
    app.kubernetes.io/name: {{ .name }}
    app.kubernetes.io/component: {{ .component }}
    {{- with $v.operator.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $v.operator.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  replicas: {{ .replicas }}
  selector:
    matchLabels:
      app.kubernetes.io/name: {{ .name }}
      app.kubernetes.io/instance: {{ $root.Release.Name }}
  template:
    metadata:
      labels:
        app.kubernetes.io/name: {{ .name }}
        app.kubernetes.io/instance: {{ $root.Release.Name }}
        app.kubernetes.io/component: {{ .component }}
        {{- with $v.operator.labels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $v.operator.annotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: {{ .name }}
      priorityClassName: {{ $v.operator.priorityClassName }}
      {{- with $v.operator.imagePullSecrets }}
      imagePullSecrets:
        {{- range . }}
        - name: {{ . }}
        {{- end }}
      {{- end }}
      securityContext:
        runAsNonRoot: true
        seccompProfile:
          type: RuntimeDefault
      containers:
      - name: {{ .command }}
        image: {{ include "gpu-operator.operatorImage" $root }}
        imagePullPolicy: {{ $v.operator.imagePullPolicy }}
        command: [{{ .command }}]
        env:
        - name: {{ .namespaceEnv }}
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        - name: POD_NAME
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        - name: LEADER_ELECT
          value: "true"
        - name: LOG_FORMAT
          value: {{ $v.operator.logFormat | quote }}
        - name: HTTP_ENDPOINT
          value: "0.0.0.0:8080"
        {{- with .extraEnv }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with $v.operator.env }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        ports:
        - name: http
          containerPort: 8080
        livenessProbe:
          httpGet:
            path: /healthz
            port: http
          initialDelaySeconds: 15
          periodSeconds: 20
        readinessProbe:
          httpGet:
            path: /readyz
            port: http
          initialDelaySeconds: 5
          periodSeconds: 10
        resources:
          {{- toYaml .resources | nindent 10 }}
        securityContext:
          {{- include "gpu-operator.containerSecurity" $root | nindent 10 }}
      {{- with $v.operator.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.operator.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.operator.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end }}
