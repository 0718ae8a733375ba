{{/*
Named templates. Every one takes the chart's own context. From a parent chart
that depends on dedupgw, pass the subchart's context, .Subcharts.dedupgw, so
names, values and the image tag are the subchart's:

  containers:
    - name: app
      ...
    {{- include "dedupgw.sidecar.container" .Subcharts.dedupgw | nindent 8 }}
  volumes:
    {{- include "dedupgw.sidecar.volumes" .Subcharts.dedupgw | nindent 8 }}
*/}}

{{/* dedupgw.name is the chart name, or nameOverride. */}}
{{- define "dedupgw.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* dedupgw.fullname is "<release>-<name>", or fullnameOverride, or the release name when it already contains the chart name. */}}
{{- define "dedupgw.fullname" -}}
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

{{/* dedupgw.chart is "<name>-<version>" for the helm.sh/chart label. */}}
{{- define "dedupgw.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* dedupgw.labels are the common labels of every object. */}}
{{- define "dedupgw.labels" -}}
helm.sh/chart: {{ include "dedupgw.chart" . }}
{{ include "dedupgw.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* dedupgw.selectorLabels select the gateway's pods; never change them in an upgrade. */}}
{{- define "dedupgw.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dedupgw.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* dedupgw.serviceAccountName is the ServiceAccount the pods run as. */}}
{{- define "dedupgw.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dedupgw.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* dedupgw.image is "repository:tag" (tag defaults to appVersion) or "repository@digest". */}}
{{- define "dedupgw.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* dedupgw.sidecarMode is "true" when mode is sidecar. */}}
{{- define "dedupgw.sidecarMode" -}}
{{- if eq .Values.mode "sidecar" }}true{{ end }}
{{- end }}

{{/* dedupgw.portName.http / .admin name the container ports; in a sidecar they carry a prefix so they cannot clash with the application's own port names. */}}
{{- define "dedupgw.portName.http" -}}
{{- if include "dedupgw.sidecarMode" . }}dedupgw-http{{ else }}http{{ end }}
{{- end }}
{{- define "dedupgw.portName.admin" -}}
{{- if include "dedupgw.sidecarMode" . }}dedupgw-admin{{ else }}admin{{ end }}
{{- end }}

{{/*
dedupgw.validate fails the render with a message naming the value to change.
It renders nothing when the values are consistent.
*/}}
{{- define "dedupgw.validate" -}}
{{- if not (has .Values.mode (list "standalone" "sidecar")) }}
{{- fail (printf "mode must be standalone or sidecar, got %q" (toString .Values.mode)) }}
{{- end }}
{{- $backend := .Values.store.backend }}
{{- if not (has $backend (list "bolt" "redis" "memory")) }}
{{- fail (printf "store.backend must be bolt, redis or memory, got %q" (toString $backend)) }}
{{- end }}
{{- if and (eq $backend "bolt") (not (include "dedupgw.sidecarMode" .)) (gt (int .Values.replicaCount) 1) }}
{{- fail (printf "store.backend=bolt keeps keys in one file that one process owns, so replicaCount must be 1 (got %d): each replica would deduplicate alone. Use store.backend=redis to run several replicas." (int .Values.replicaCount)) }}
{{- end }}
{{- if and (eq $backend "redis") (not .Values.store.redis.addrs) }}
{{- fail "store.backend=redis needs store.redis.addrs" }}
{{- end }}
{{- if not .Values.routes }}
{{- fail "routes is empty: the gateway needs at least one route" }}
{{- end }}
{{- if and (not .Values.admin.insecure) (not .Values.admin.tokenSecret.name) }}
{{- $hasToken := false }}
{{- range .Values.env }}{{ if eq .name "DEDUPGW_ADMIN_TOKEN" }}{{ $hasToken = true }}{{ end }}{{ end }}
{{- if and (not $hasToken) (not .Values.existingSecret) (not .Values.envFrom) }}
{{- fail "admin.insecure=false needs a token: set admin.tokenSecret.name (or DEDUPGW_ADMIN_TOKEN through existingSecret/env), because the probes reach the admin port on the pod IP" }}
{{- end }}
{{- end }}
{{- end }}

{{/* dedupgw.config is the gateway's config.yaml, rendered from values. */}}
{{- define "dedupgw.config" -}}
{{- $admin := dict "listen" (printf ":%d" (int .Values.ports.admin)) }}
{{- if and .Values.admin.insecure (not .Values.admin.tokenSecret.name) }}
{{- $_ := set $admin "insecure" true }}
{{- end }}
{{- $store := dict "backend" .Values.store.backend }}
{{- if eq .Values.store.backend "bolt" }}
{{- $_ := set $store "bolt" .Values.store.bolt }}
{{- else if eq .Values.store.backend "redis" }}
{{- $_ := set $store "redis" .Values.store.redis }}
{{- end }}
{{- $cfg := dict "listen" (printf ":%d" (int .Values.ports.http)) "admin" $admin "log" .Values.log "store" $store "routes" .Values.routes }}
{{- with .Values.defaults }}
{{- $_ := set $cfg "defaults" . }}
{{- end }}
{{- with .Values.server }}
{{- $_ := set $cfg "server" . }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/* dedupgw.configMapName names the ConfigMap holding config.yaml. */}}
{{- define "dedupgw.configMapName" -}}
{{- if include "dedupgw.sidecarMode" . }}
{{- .Values.sidecar.configMapName | default (printf "%s-dedupgw-sidecar" .Release.Name) | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- include "dedupgw.fullname" . }}
{{- end }}
{{- end }}

{{/* dedupgw.configChecksum changes whenever config.yaml does; put it in a pod annotation so a config change rolls the pods. */}}
{{- define "dedupgw.configChecksum" -}}
{{- include "dedupgw.config" . | sha256sum }}
{{- end }}

{{/* dedupgw.dataVolumeNeeded is "true" when the store keeps a file in /var/lib/dedupgw. */}}
{{- define "dedupgw.dataVolumeNeeded" -}}
{{- if eq .Values.store.backend "bolt" }}true{{ end }}
{{- end }}

{{/*
dedupgw.container is the gateway container as one list item of a pod's
containers. Standalone and sidecar use the same container.
*/}}
{{- define "dedupgw.container" -}}
- name: dedupgw
  image: {{ include "dedupgw.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args: ["serve", "--config", "/etc/dedupgw/config.yaml"]
  ports:
    - name: {{ include "dedupgw.portName.http" . }}
      containerPort: {{ int .Values.ports.http }}
      protocol: TCP
    - name: {{ include "dedupgw.portName.admin" . }}
      containerPort: {{ int .Values.ports.admin }}
      protocol: TCP
  {{- $memLimit := and .Values.goMemLimit (dig "limits" "memory" "" (.Values.resources | default dict)) }}
  {{- range .Values.env }}{{ if eq .name "GOMEMLIMIT" }}{{ $memLimit = false }}{{ end }}{{ end }}
  {{- if or .Values.admin.tokenSecret.name .Values.env $memLimit }}
  env:
    {{- if .Values.admin.tokenSecret.name }}
    - name: DEDUPGW_ADMIN_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ .Values.admin.tokenSecret.name }}
          key: {{ .Values.admin.tokenSecret.key }}
    {{- end }}
    {{- if $memLimit }}
    # The Go runtime's soft memory limit: the container's, so the garbage
    # collector works harder before the kernel's OOM killer would.
    - name: GOMEMLIMIT
      valueFrom:
        resourceFieldRef:
          resource: limits.memory
    {{- end }}
    {{- with .Values.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
  {{- if or .Values.existingSecret .Values.envFrom }}
  envFrom:
    {{- if .Values.existingSecret }}
    - secretRef:
        name: {{ .Values.existingSecret }}
    {{- end }}
    {{- with .Values.envFrom }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: {{ include "dedupgw.portName.admin" . }}
    {{- toYaml .Values.livenessProbe | nindent 4 }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: {{ include "dedupgw.portName.admin" . }}
    {{- toYaml .Values.readinessProbe | nindent 4 }}
  {{- with .Values.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: dedupgw-config
      mountPath: /etc/dedupgw
      readOnly: true
    {{- if include "dedupgw.dataVolumeNeeded" . }}
    - name: dedupgw-data
      mountPath: /var/lib/dedupgw
    {{- end }}
{{- end }}

{{/*
dedupgw.volumes are the pod volumes the container mounts, as list items.
Standalone bolt uses the PVC (or an emptyDir when persistence is off); a
sidecar's bolt file lives in an emptyDir: it survives container restarts, not
the pod.
*/}}
{{- define "dedupgw.volumes" -}}
- name: dedupgw-config
  configMap:
    name: {{ include "dedupgw.configMapName" . }}
{{- if include "dedupgw.dataVolumeNeeded" . }}
- name: dedupgw-data
  {{- if and (not (include "dedupgw.sidecarMode" .)) .Values.persistence.enabled }}
  persistentVolumeClaim:
    claimName: {{ .Values.persistence.existingClaim | default (printf "%s-data" (include "dedupgw.fullname" .)) }}
  {{- else }}
  emptyDir: {}
  {{- end }}
{{- end }}
{{- end }}

{{/* dedupgw.sidecar.container is the gateway container to add to your own pod (call it with .Subcharts.dedupgw). */}}
{{- define "dedupgw.sidecar.container" -}}
{{- include "dedupgw.validate" . }}
{{- if not (include "dedupgw.sidecarMode" .) }}
{{- fail "dedupgw.sidecar.container needs mode: sidecar in the dedupgw values" }}
{{- end }}
{{- include "dedupgw.container" . }}
{{- end }}

{{/* dedupgw.sidecar.volumes are the volumes the sidecar container mounts (call it with .Subcharts.dedupgw). */}}
{{- define "dedupgw.sidecar.volumes" -}}
{{- include "dedupgw.volumes" . }}
{{- end }}

{{/* dedupgw.sidecar.annotations are pod annotations that roll your pods when the gateway's config changes. */}}
{{- define "dedupgw.sidecar.annotations" -}}
checksum/dedupgw-config: {{ include "dedupgw.configChecksum" . }}
{{- end }}
