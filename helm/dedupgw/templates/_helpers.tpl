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
{{- /* A label value: at most 63 of A-Z a-z 0-9 . _ -, alphanumeric at both ends (a long CI tag would otherwise fail every object). */}}
app.kubernetes.io/version: {{ regexReplaceAll "[^A-Za-z0-9._-]" (.Values.image.tag | default .Chart.AppVersion | toString) "_" | trunc 63 | trimAll "-_." | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* dedupgw.selectorLabels select the gateway's pods; never change them in an upgrade. */}}
{{- define "dedupgw.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dedupgw.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end }}

{{/* dedupgw.servicePublished is "true" when service.type publishes the Service's ports outside the cluster (LoadBalancer, NodePort): the admin port then gets a ClusterIP Service of its own. */}}
{{- define "dedupgw.servicePublished" -}}
{{- if has .Values.service.type (list "LoadBalancer" "NodePort") }}true{{ end }}
{{- end }}

{{/* dedupgw.adminServiceName names the Service that carries the admin port: the main Service, or "<fullname>-admin" when the main one is published. */}}
{{- define "dedupgw.adminServiceName" -}}
{{- if include "dedupgw.servicePublished" . }}
{{- printf "%s-admin" (include "dedupgw.fullname" . | trunc 57 | trimSuffix "-") }}
{{- else }}
{{- include "dedupgw.fullname" . }}
{{- end }}
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
{{- $standalone := not (include "dedupgw.sidecarMode" .) }}
{{- /* In sidecar mode the app's own chart renders the pod: pod-level values
set here would silently go nowhere (a private image would not pull). */}}
{{- if not $standalone }}
{{- range list "imagePullSecrets" "podAnnotations" "podLabels" "nodeSelector" "tolerations" "affinity" "topologySpreadConstraints" "priorityClassName" }}
{{- if get $.Values . }}
{{- fail (printf "%s is set, but in sidecar mode the chart renders no pod: your app's chart renders it, so set %s on your app's pod spec instead" . .) }}
{{- end }}
{{- end }}
{{- if .Values.serviceMonitor.enabled }}
{{- fail "serviceMonitor.enabled is set, but in sidecar mode the chart renders no Service to scrape: scrape the pod's dedupgw-admin port from your app's chart (a PodMonitor, or a ServiceMonitor on your app's Service)" }}
{{- end }}
{{- if .Values.networkPolicy.enabled }}
{{- fail "networkPolicy.enabled is set, but in sidecar mode the chart renders no pod: a NetworkPolicy selects your app's pods, so write it in your app's chart (admit the dedupgw-http port, and the dedupgw-admin port only from Prometheus)" }}
{{- end }}
{{- end }}
{{- $backend := .Values.store.backend }}
{{- if not (has $backend (list "bolt" "redis" "memory")) }}
{{- fail (printf "store.backend must be bolt, redis or memory, got %q" (toString $backend)) }}
{{- end }}
{{- $alone := dict "bolt" "keeps keys in one file that one process owns" "memory" "keeps keys in each process" }}
{{- if and (hasKey $alone $backend) $standalone (gt (int .Values.replicaCount) 1) }}
{{- fail (printf "store.backend=%s %s, so replicaCount must be 1 (got %d): each replica would deduplicate alone. Use store.backend=redis to run several replicas." $backend (get $alone $backend) (int .Values.replicaCount)) }}
{{- end }}
{{- if and (eq $backend "bolt") $standalone .Values.strategy (ne (toString (get .Values.strategy "type")) "Recreate") }}
{{- fail (printf "strategy.type=%s with store.backend=bolt: the new pod would wait for the old one's volume and file lock, and the rollout would hang. Leave strategy empty (the chart uses Recreate for bolt) or set strategy.type=Recreate" (toString (get .Values.strategy "type" | default "RollingUpdate"))) }}
{{- end }}
{{- if and (eq $backend "bolt") (not (hasPrefix "/var/lib/dedupgw/" (toString .Values.store.bolt.path))) }}
{{- fail (printf "store.bolt.path %q is outside the data volume mounted at /var/lib/dedupgw/: the root filesystem is read-only, and anything else would not outlive the pod. Use a path like /var/lib/dedupgw/dedupgw.db" (toString .Values.store.bolt.path)) }}
{{- end }}
{{- if eq (int .Values.ports.http) (int .Values.ports.admin) }}
{{- fail (printf "ports.http and ports.admin are both %d: the gateway refuses an admin listener on its own address. Give them different ports" (int .Values.ports.http)) }}
{{- end }}
{{- if and $standalone (eq (int .Values.service.port) (int .Values.service.adminPort)) }}
{{- fail (printf "service.port and service.adminPort are both %d: a Service cannot have two ports with one number. Give them different ports" (int .Values.service.port)) }}
{{- end }}
{{- $own := include "dedupgw.labels" . | fromYaml }}
{{- range $k, $_ := .Values.podLabels }}
{{- if hasKey $own $k }}
{{- fail (printf "podLabels.%s: the chart sets this label itself (the Deployment's selector and the common labels use it); choose another key" $k) }}
{{- end }}
{{- end }}
{{- $repo := toString .Values.image.repository }}
{{- if contains ":" (last (splitList "/" $repo)) }}
{{- fail (printf "image.repository %q holds a tag or digest: give the repository alone, and the tag in image.tag (or the digest in image.digest)" $repo) }}
{{- end }}
{{- /* In env: a secret's literal value would sit in clear in the Deployment;
and DEDUPGW_* overrides of what the chart derives the probes, the Service,
the volume and the grace period from would change the config behind its
back. (Secrets in existingSecret stay fine.) */}}
{{- $secrets := list "DEDUPGW_ADMIN_TOKEN" "DEDUPGW_STORE_REDIS_PASSWORD" "DEDUPGW_STORE_REDIS_SENTINEL_PASSWORD" }}
{{- $derived := dict "DEDUPGW_LISTEN" "ports.http" "DEDUPGW_ADMIN_LISTEN" "ports.admin" "DEDUPGW_STORE_BACKEND" "store.backend" "DEDUPGW_STORE_BOLT_PATH" "store.bolt.path" "DEDUPGW_DEFAULTS_UPSTREAM_TIMEOUT" "defaults.upstream_timeout" "DEDUPGW_DEFAULTS_LEASE" "defaults.lease" }}
{{- range $i, $e := .Values.env }}
{{- $name := toString (get $e "name") }}
{{- if and (has $name $secrets) (toString (get $e "value" | default "")) }}
{{- fail (printf "env[%d] gives %s a literal value, which would sit in clear in the Deployment: take it from a Secret (valueFrom.secretKeyRef, or existingSecret%s)" $i $name (ternary ", or admin.tokenSecret.name" "" (eq $name "DEDUPGW_ADMIN_TOKEN"))) }}
{{- end }}
{{- if hasKey $derived $name }}
{{- fail (printf "env[%d] sets %s, which the chart derives the pod from (probes, Service, volume or grace period): set %s in the values instead" $i $name (get $derived $name)) }}
{{- end }}
{{- end }}
{{- /* The chart's own volumes and mount paths: Kubernetes refuses a pod
with two volumes of one name, and a mount over the config or the data
directory would hide it. */}}
{{- range $i, $v := .Values.extraVolumes }}
{{- if has (toString (get $v "name")) (list "dedupgw-config" "dedupgw-data") }}
{{- fail (printf "extraVolumes[%d].name %q is a volume of the chart's own: choose another name" $i (toString (get $v "name"))) }}
{{- end }}
{{- end }}
{{- range $i, $m := .Values.extraVolumeMounts }}
{{- $mp := trimSuffix "/" (toString (get $m "mountPath")) }}
{{- range list "/etc/dedupgw" "/var/lib/dedupgw" }}
{{- if or (eq $mp .) (hasPrefix (printf "%s/" .) $mp) }}
{{- fail (printf "extraVolumeMounts[%d].mountPath %q is in %s, the chart's own mount: mount elsewhere, e.g. /var/run/secrets/dedupgw" $i $mp .) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (eq $backend "redis") (not .Values.store.redis.addrs) }}
{{- fail "store.backend=redis needs store.redis.addrs" }}
{{- end }}
{{- if not .Values.routes }}
{{- fail "routes is empty: the gateway needs at least one route" }}
{{- end }}
{{- /* Secrets go to the environment (existingSecret) or to files
(extraVolumes), and config.yaml names them as ${VAR} or ${file:PATH}: a
literal here would sit in clear in the ConfigMap. The error never repeats
the value. */}}
{{- $ref := "^(\\$\\{[A-Za-z_][A-Za-z0-9_]*\\}|\\$\\{file:[^}$]+\\})+$" }}
{{- $pw := .Values.store.redis.password | default "" | toString }}
{{- if and (eq $backend "redis") $pw (not (regexMatch $ref $pw)) }}
{{- fail "store.redis.password holds a literal password, which would be written in clear to the ConfigMap. Put the password in the Secret named by existingSecret (e.g. as REDIS_PASSWORD) and set store.redis.password: \"${REDIS_PASSWORD}\" (or mount the Secret with extraVolumes and write \"${file:/path/to/key}\")" }}
{{- end }}
{{- $spw := .Values.store.redis.sentinel_password | default "" | toString }}
{{- if and (eq $backend "redis") $spw (not (regexMatch $ref $spw)) }}
{{- fail "store.redis.sentinel_password holds a literal password, which would be written in clear to the ConfigMap. Put the password in the Secret named by existingSecret (e.g. as SENTINEL_PASSWORD) and set store.redis.sentinel_password: \"${SENTINEL_PASSWORD}\" (or mount the Secret with extraVolumes and write \"${file:/path/to/key}\")" }}
{{- end }}
{{- range $i, $r := .Values.routes }}
{{- range $j, $s := get $r "secrets" | default list }}
{{- if and $s (not (regexMatch $ref (toString $s))) }}
{{- fail (printf "routes[%d].secrets[%d] (route %q) holds a literal secret, which would be written in clear to the ConfigMap. Put it in the Secret named by existingSecret (e.g. as WEBHOOK_SECRET) and write \"${WEBHOOK_SECRET}\" in secrets (or mount the Secret with extraVolumes and write \"${file:/path/to/key}\")" $i $j (toString (get $r "name"))) }}
{{- end }}
{{- end }}
{{- $cis := get $r "client_identity_secret" | default "" | toString }}
{{- if and $cis (not (regexMatch $ref $cis)) }}
{{- fail (printf "routes[%d].client_identity_secret (route %q) holds a literal secret, which would be written in clear to the ConfigMap. Put it in the Secret named by existingSecret (e.g. as CLIENT_IDENTITY_SECRET) and write \"${CLIENT_IDENTITY_SECRET}\" in client_identity_secret (or mount the Secret with extraVolumes and write \"${file:/path/to/key}\")" $i (toString (get $r "name"))) }}
{{- end }}
{{- end }}
{{- $_ := include "dedupgw.terminationGracePeriodSeconds" . }}
{{- include "dedupgw.validateLeases" . }}
{{- include "dedupgw.validateDurations" . }}
{{- if and $standalone .Values.serviceMonitor.enabled }}
{{- $iv := include "dedupgw.durationExact" (dict "value" .Values.serviceMonitor.interval "lenient" true) }}
{{- $to := include "dedupgw.durationExact" (dict "value" .Values.serviceMonitor.scrapeTimeout "lenient" true) }}
{{- if and (ne $iv "unknown") (ne $to "unknown") (gt (float64 $to) (float64 $iv)) }}
{{- fail (printf "serviceMonitor.scrapeTimeout %v is longer than serviceMonitor.interval %v: the Prometheus Operator skips such a ServiceMonitor, and no metrics are scraped. Lower scrapeTimeout" .Values.serviceMonitor.scrapeTimeout .Values.serviceMonitor.interval) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
dedupgw.validateDurations fails the render on a duration the gateway would
refuse at start-up (the pod would crash-loop): zero or negative for the
keys that must be greater than 0, negative for those that must not be.
${VAR} references are left to the gateway.
*/}}
{{- define "dedupgw.validateDurations" -}}
{{- $positive := list }}
{{- $policy := list "window" "failed_retention" "lease" "upstream_timeout" }}
{{- $d := .Values.defaults | default dict }}
{{- range $policy }}{{ if hasKey $d . }}{{ $positive = append $positive (list (printf "defaults.%s" .) (get $d .)) }}{{ end }}{{ end }}
{{- range $i, $r := .Values.routes }}
{{- range append $policy "tolerance" }}{{ if hasKey $r . }}{{ $positive = append $positive (list (printf "routes[%d].%s" $i .) (get $r .)) }}{{ end }}{{ end }}
{{- end }}
{{- $srv := .Values.server | default dict }}
{{- range list "read_header_timeout" "read_timeout" "idle_timeout" }}{{ if hasKey $srv . }}{{ $positive = append $positive (list (printf "server.%s" .) (get $srv .)) }}{{ end }}{{ end }}
{{- range $positive }}
{{- $key := index . 0 }}{{ $v := toString (index . 1) | trim }}
{{- if or (hasPrefix "-" $v) (eq (include "dedupgw.durationExact" (dict "value" $v "lenient" true)) "0") }}
{{- fail (printf "%s: %q must be greater than 0, or the gateway refuses the config at start-up" $key $v) }}
{{- end }}
{{- end }}
{{- $redis := .Values.store.redis | default dict }}
{{- range list "dial_timeout" "wait_timeout" }}
{{- if hasPrefix "-" (toString (get $redis .) | trim) }}
{{- fail (printf "store.redis.%s: %q must not be negative, or the gateway refuses the config at start-up" . (toString (get $redis .))) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
dedupgw.validateLeases fails the render when a route's lease is not longer
than its upstream_timeout, each inherited from defaults (60s and 30s when
unset): the gateway refuses such a config at start-up, so the pod would only
crash-loop. Durations the chart cannot read (a ${VAR}) are left to the
gateway.
*/}}
{{- define "dedupgw.validateLeases" -}}
{{- $d := .Values.defaults | default dict }}
{{- $defLease := get $d "lease" | default "60s" }}
{{- $defTimeout := get $d "upstream_timeout" | default "30s" }}
{{- range $i, $r := .Values.routes }}
{{- $lease := get $r "lease" | default $defLease }}
{{- $timeout := get $r "upstream_timeout" | default $defTimeout }}
{{- $ls := include "dedupgw.durationExact" (dict "value" $lease "lenient" true) }}
{{- $ts := include "dedupgw.durationExact" (dict "value" $timeout "lenient" true) }}
{{- if and (ne $ls "unknown") (ne $ts "unknown") (le (float64 $ls) (float64 $ts)) }}
{{- fail (printf "routes[%d] (route %q): lease %v must be longer than upstream_timeout %v (each from the route, else defaults, else 60s and 30s), or the gateway refuses the config at start-up. Raise lease (in defaults or on the route), e.g. to the upstream_timeout plus 30s" $i (toString (get $r "name")) $lease $timeout) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
dedupgw.adminToken says where the admin API token comes from:
  existing   admin.tokenSecret.name, a Secret you manage;
  env        DEDUPGW_ADMIN_TOKEN set in env;
  insecure   none: admin.insecure is true (config.yaml says insecure: true);
  generated  a random token the chart keeps in its own Secret
             (dedupgw.adminTokenSecretName), the default.
*/}}
{{- define "dedupgw.adminToken" -}}
{{- $inEnv := false }}
{{- range .Values.env }}{{ if eq .name "DEDUPGW_ADMIN_TOKEN" }}{{ $inEnv = true }}{{ end }}{{ end }}
{{- if .Values.admin.tokenSecret.name }}existing
{{- else if $inEnv }}env
{{- else if .Values.admin.insecure }}insecure
{{- else }}generated
{{- end }}
{{- end }}

{{/* dedupgw.adminTokenSecretName names the Secret the container reads DEDUPGW_ADMIN_TOKEN from: admin.tokenSecret.name, or the chart's own "<config map name>-admin". */}}
{{- define "dedupgw.adminTokenSecretName" -}}
{{- .Values.admin.tokenSecret.name | default (printf "%s-admin" (include "dedupgw.configMapName" .)) }}
{{- end }}

{{/* dedupgw.adminTokenSecretKey is the key of the token in that Secret. */}}
{{- define "dedupgw.adminTokenSecretKey" -}}
{{- if .Values.admin.tokenSecret.name }}{{ .Values.admin.tokenSecret.key | default "admin-token" }}{{ else }}admin-token{{ end }}
{{- end }}

{{/*
dedupgw.durationSeconds reads a Go duration ("30s", "2m", "1m30s", "1h",
"1.5s", "250ms") and renders its length in whole seconds, rounded up. It takes
(dict "value" "30s" "key" "defaults.upstream_timeout" "lenient" false) and, on
anything else (a ${VAR} reference, a bare number), renders "unknown" when
lenient and otherwise fails the render naming the key.
*/}}
{{- define "dedupgw.durationSeconds" -}}
{{- $exact := include "dedupgw.durationExact" . }}
{{- if eq $exact "unknown" }}unknown
{{- else }}{{ printf "%.0f" (ceil (float64 $exact)) }}
{{- end }}
{{- end }}

{{/*
dedupgw.durationExact is dedupgw.durationSeconds without the rounding: the
length in seconds as a decimal ("90", "0.25"), for comparisons.
*/}}
{{- define "dedupgw.durationExact" -}}
{{- $v := toString .value | trim }}
{{- $num := "([0-9]+(\\.[0-9]*)?|\\.[0-9]+)" }}
{{- $units := "(h|ms|m|s|us|µs|ns)" }}
{{- if eq $v "0" }}0
{{- else if not (regexMatch (printf "^(%s%s)+$" $num $units) $v) }}
{{- if .lenient }}unknown{{ else }}
{{- fail (printf "%s: cannot read %q as a duration, and the chart derives terminationGracePeriodSeconds from the longest upstream_timeout. Write a Go duration such as \"30s\", \"2m\" or \"1m30s\", or set terminationGracePeriodSeconds yourself" .key $v) }}
{{- end }}
{{- else }}
{{- $mul := dict "h" 3600.0 "m" 60.0 "s" 1.0 }}
{{- $div := dict "ms" 1000.0 "us" 1000000.0 "µs" 1000000.0 "ns" 1000000000.0 }}
{{- $total := 0.0 }}
{{- range regexFindAll (printf "%s%s" $num $units) $v -1 }}
{{- $n := regexFind "^[0-9.]+" . }}
{{- $u := trimPrefix $n . }}
{{- if hasKey $mul $u }}
{{- $total = addf $total (mulf (float64 $n) (get $mul $u)) }}
{{- else }}
{{- $total = addf $total (divf (float64 $n) (get $div $u)) }}
{{- end }}
{{- end }}
{{- $total }}
{{- end }}
{{- end }}

{{/*
dedupgw.drainSeconds is how long the gateway may drain after SIGTERM: the
longest upstream_timeout (defaults.upstream_timeout, 30s when unset, and every
route's own) plus 5 s, as the gateway computes it. When
terminationGracePeriodSeconds is set, an upstream_timeout the chart cannot
read makes it "unknown" instead of failing the render.
*/}}
{{- define "dedupgw.drainSeconds" -}}
{{- $lenient := not (kindIs "invalid" .Values.terminationGracePeriodSeconds) }}
{{- $all := list }}
{{- with get (.Values.defaults | default dict) "upstream_timeout" }}
{{- $all = append $all (include "dedupgw.durationSeconds" (dict "value" . "key" "defaults.upstream_timeout" "lenient" $lenient)) }}
{{- else }}
{{- $all = append $all "30" }}
{{- end }}
{{- range $i, $r := .Values.routes }}
{{- with get $r "upstream_timeout" }}
{{- $all = append $all (include "dedupgw.durationSeconds" (dict "value" . "key" (printf "routes[%d].upstream_timeout" $i) "lenient" $lenient)) }}
{{- end }}
{{- end }}
{{- if has "unknown" $all }}unknown
{{- else }}
{{- $longest := 0 }}
{{- range $all }}{{ $longest = max $longest (int .) }}{{ end }}
{{- add $longest 5 }}
{{- end }}
{{- end }}

{{/*
dedupgw.sidecar.preStopSleepSeconds is how long your app container should
sleep in a preStop hook so the gateway beside it can drain first: the drain
(dedupgw.drainSeconds). It fails the render when an upstream_timeout cannot be
read.
*/}}
{{- define "dedupgw.sidecar.preStopSleepSeconds" -}}
{{- $drain := include "dedupgw.drainSeconds" . }}
{{- if eq $drain "unknown" }}
{{- fail "dedupgw.sidecar.preStopSleepSeconds: an upstream_timeout is not a Go duration the chart can read (e.g. a ${VAR}); write it as \"30s\", \"2m\"..." }}
{{- end }}
{{- $drain }}
{{- end }}

{{/*
dedupgw.terminationGracePeriodSeconds is the pod's grace period: the drain
(dedupgw.drainSeconds) plus 10 s to answer, release and close, unless
terminationGracePeriodSeconds is set; a value set shorter than the drain plus
5 s fails the render.
*/}}
{{- define "dedupgw.terminationGracePeriodSeconds" -}}
{{- $drainStr := include "dedupgw.drainSeconds" . }}
{{- $drain := add (int $drainStr) (int (include "dedupgw.preStopSleepSeconds" .)) }}
{{- $set := .Values.terminationGracePeriodSeconds }}
{{- if kindIs "invalid" $set }}
{{- add $drain 10 }}
{{- else if and (ne $drainStr "unknown") (lt (int $set) (add $drain 5)) }}
{{- fail (printf "terminationGracePeriodSeconds=%d is too short: on SIGTERM the gateway drains for up to %d s (the longest upstream_timeout + 5 s, after preStopSleepSeconds), so the kubelet would kill it mid-drain. Set it to at least %d, or leave it empty (null) to have the chart derive it (%d)" (int $set) $drain (add $drain 5) (add $drain 10)) }}
{{- else }}
{{- int $set }}
{{- end }}
{{- end }}

{{/*
dedupgw.preStopSleepSeconds is how long the standalone pod's preStop hook
sleeps before the kubelet sends SIGTERM: 0 in sidecar mode (the app's pod
spec owns the hooks) or when unset.
*/}}
{{- define "dedupgw.preStopSleepSeconds" -}}
{{- if include "dedupgw.sidecarMode" . }}0{{ else }}{{ int (.Values.preStopSleepSeconds | default 0) }}{{ end }}
{{- end }}

{{/*
dedupgw.goMemLimit is GOMEMLIMIT in bytes: 90 % of resources.limits.memory,
leaving the rest for memory the Go runtime does not manage or count. It reads
a plain number of bytes or a number with a suffix Ki, Mi, Gi, Ti, Pi, Ei, k,
M, G, T, P or E (the forms Kubernetes documents) and fails the render on any
other quantity form.
*/}}
{{- define "dedupgw.goMemLimit" -}}
{{- $lim := . }}
{{- $s := "" }}
{{- if kindIs "string" $lim }}{{ $s = trim $lim }}{{ else }}{{ $s = printf "%.0f" (float64 $lim) }}{{ end }}
{{- $m := regexFindAll "^([0-9]+(\\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$" $s 1 }}
{{- if not $m }}
{{- fail (printf "resources.limits.memory %q: the chart sets GOMEMLIMIT to 90%% of it and reads only bytes or a number with a suffix Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P or E (e.g. 256Mi). Write it so, or set GOMEMLIMIT in env, or goMemLimit: false" $s) }}
{{- end }}
{{- $n := regexFind "^[0-9.]+" $s }}
{{- $u := trimPrefix $n $s }}
{{- $mult := dict "" 1.0 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 }}
{{- $bytes := ceil (mulf (float64 $n) (get $mult $u)) }}
{{- printf "%.0f" (floor (divf (mulf $bytes 9.0) 10.0)) }}
{{- end }}

{{/*
dedupgw.readinessPath is the readiness probe's path: /readyz ("the store is
reachable") or /healthz ("the process serves"), per the readiness value. ""
picks /readyz only standalone and when every route has on_store_error:
reject (its own, or defaults', or an env entry
DEDUPGW_DEFAULTS_ON_STORE_ERROR's, which the gateway takes over defaults;
one from valueFrom counts as not reject): a route that fails open needs its replicas
in the Service during a store outage, which takes every replica sharing
Redis out at once. In sidecar mode the gateway's readiness is the whole
pod's, and a store outage would take the app's own traffic out of its
Services: /healthz.
*/}}
{{- define "dedupgw.readinessPath" -}}
{{- $r := .Values.readiness }}
{{- if not $r }}
{{- $r = "process" }}
{{- if ne .Values.mode "sidecar" }}
{{- $default := lower (toString (dig "on_store_error" "forward" (.Values.defaults | default dict))) }}
{{- /* the gateway takes the variable over defaults (Kubernetes keeps the
last of duplicate entries); one from a valueFrom cannot be read here: not
"reject"; an empty or blank one the gateway ignores: defaults' applies */}}
{{- $envEntry := dict }}
{{- range .Values.env }}
{{- if eq .name "DEDUPGW_DEFAULTS_ON_STORE_ERROR" }}{{ $envEntry = . }}{{ end }}
{{- end }}
{{- if hasKey $envEntry "valueFrom" }}
{{- $default = "unknown" }}
{{- else if trim (toString (get $envEntry "value" | default "")) }}
{{- $default = lower (toString (get $envEntry "value")) }}
{{- end }}
{{- $allReject := true }}
{{- range .Values.routes }}
{{- if ne (lower (toString (dig "on_store_error" $default .))) "reject" }}
{{- $allReject = false }}
{{- end }}
{{- end }}
{{- if $allReject }}
{{- $r = "store" }}
{{- end }}
{{- end }}
{{- end }}
{{- if eq $r "store" }}/readyz{{ else }}/healthz{{ end }}
{{- end }}

{{/* dedupgw.config is the gateway's config.yaml, rendered from values. */}}
{{- define "dedupgw.config" -}}
{{- $admin := dict "listen" (printf ":%d" (int .Values.ports.admin)) }}
{{- if eq (include "dedupgw.adminToken" .) "insecure" }}
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
  {{- $token := has (include "dedupgw.adminToken" .) (list "existing" "generated") }}
  {{- if or $token .Values.env $memLimit }}
  env:
    {{- if $token }}
    # /v1/keys needs "Authorization: Bearer <token>"; /healthz, /readyz and
    # /metrics stay open for the kubelet and Prometheus.
    - name: DEDUPGW_ADMIN_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ include "dedupgw.adminTokenSecretName" . | quote }}
          key: {{ include "dedupgw.adminTokenSecretKey" . | quote }}
    {{- end }}
    {{- if $memLimit }}
    # The Go runtime's soft memory limit: 90 % of limits.memory ({{ $memLimit }}),
    # so the garbage collector works harder before the kernel's OOM killer
    # would, with room for memory the runtime does not count.
    - name: GOMEMLIMIT
      value: {{ include "dedupgw.goMemLimit" $memLimit | quote }}
    {{- end }}
    {{- range .Values.env }}
    {{- /* Kubernetes takes only strings as values: --set env[0].value=200
    (GOGC) parses as a number, and the API server would refuse the pod. */}}
    {{- $e := deepCopy . }}
    {{- if hasKey $e "value" }}{{ $_ := set $e "value" (include "dedupgw.toString" $e.value) }}{{ end }}
    - {{ toYaml $e | nindent 6 | trim }}
    {{- end }}
  {{- end }}
  {{- if or .Values.existingSecret .Values.envFrom }}
  envFrom:
    {{- if .Values.existingSecret }}
    - secretRef:
        name: {{ .Values.existingSecret | quote }}
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
      path: {{ include "dedupgw.readinessPath" . }}
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
  {{- with int (include "dedupgw.preStopSleepSeconds" .) }}
  # Keep serving while the endpoint removal reaches every load balancer
  # and ingress; SIGTERM (and the drain) follow the sleep.
  lifecycle:
    preStop:
      sleep:
        seconds: {{ . }}
  {{- end }}
  volumeMounts:
    - name: dedupgw-config
      mountPath: /etc/dedupgw
      readOnly: true
    {{- if include "dedupgw.dataVolumeNeeded" . }}
    - name: dedupgw-data
      mountPath: /var/lib/dedupgw
    {{- end }}
    {{- with .Values.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{/*
dedupgw.volumes are the pod volumes the container mounts, as list items.
Standalone bolt uses the PVC (or an emptyDir when persistence is off); a
sidecar's bolt file lives in an emptyDir: it survives container restarts, not
the pod. extraVolumes follow.
*/}}
{{- define "dedupgw.volumes" -}}
- name: dedupgw-config
  configMap:
    name: {{ include "dedupgw.configMapName" . | quote }}
{{- if include "dedupgw.dataVolumeNeeded" . }}
- name: dedupgw-data
  {{- if and (not (include "dedupgw.sidecarMode" .)) .Values.persistence.enabled }}
  persistentVolumeClaim:
    claimName: {{ .Values.persistence.existingClaim | default (printf "%s-data" (include "dedupgw.fullname" .)) | quote }}
  {{- else }}
  emptyDir: {}
  {{- end }}
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
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

{{/*
dedupgw.strings renders a map of labels, annotations or node selectors with
every value a string, as Kubernetes requires: --set podAnnotations.x=1 or
prometheus.io/scrape: true in a values file would otherwise render a number
or a boolean, which the API server refuses.
*/}}
{{- define "dedupgw.strings" -}}
{{- $out := dict }}
{{- range $k, $v := . }}{{ $_ := set $out $k (include "dedupgw.toString" $v) }}{{ end }}
{{- toYaml $out }}
{{- end }}

{{/*
dedupgw.toString is a value as the string Kubernetes takes. A number from a
values file is a float64 to Helm, which toString writes as 2.4159191e+08:
a whole one is written out instead (241591910), as GOMEMLIMIT must be.
*/}}
{{- define "dedupgw.toString" -}}
{{- if kindIs "invalid" . -}}
{{- /* null: the empty string, not "<nil>" */ -}}
{{- else if and (kindIs "float64" .) (eq (float64 (int64 .)) .) -}}
{{- printf "%.0f" . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end }}

{{/*
dedupgw.intOrPercent renders a PodDisruptionBudget count, given as a string
("1", "50%"), as Kubernetes' IntOrString: a number, or a quoted percentage.
*/}}
{{- define "dedupgw.intOrPercent" -}}
{{- if regexMatch "^[0-9]+%$" . -}}
{{- quote . -}}
{{- else if regexMatch "^[0-9]+$" . -}}
{{- . -}}
{{- else -}}
{{- fail (printf "podDisruptionBudget: %q is neither a whole number nor a percentage such as 50%%" .) -}}
{{- end -}}
{{- end }}
