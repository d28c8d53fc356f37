{{/* Chart name, truncated to the 63 characters Kubernetes names allow. */}}
{{- define "ai-stack.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name. */}}
{{- define "ai-stack.fullname" -}}
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

{{- define "ai-stack.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Names of the components. */}}
{{- define "ai-stack.gateway.fullname" -}}{{ include "ai-stack.fullname" . | trunc 55 | trimSuffix "-" }}-gateway{{- end }}
{{- define "ai-stack.triton.fullname" -}}{{ include "ai-stack.fullname" . | trunc 56 | trimSuffix "-" }}-triton{{- end }}
{{- define "ai-stack.redis.fullname" -}}{{ include "ai-stack.fullname" . | trunc 57 | trimSuffix "-" }}-redis{{- end }}

{{/* Selector labels: stable, without the chart version. Call with (dict "ctx" $ "component" "gateway"). */}}
{{- define "ai-stack.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ai-stack.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Full labels. Call with (dict "ctx" $ "component" "gateway"). */}}
{{- define "ai-stack.labels" -}}
helm.sh/chart: {{ include "ai-stack.chart" .ctx }}
{{ include "ai-stack.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: {{ include "ai-stack.name" .ctx }}
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Pod labels: no chart or app version, so that a chart bump alone restarts no pod (Triton: minutes of
model load). Call with (dict "ctx" $ "component" "gateway"). */}}
{{- define "ai-stack.podLabels" -}}
{{ include "ai-stack.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: {{ include "ai-stack.name" .ctx }}
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "ai-stack.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ai-stack.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Triton's gRPC address for the gateway: the headless Service's name, resolved to every ready pod. */}}
{{- define "ai-stack.triton.url" -}}
{{- printf "dns:///%s-headless.%s.svc:8001" (include "ai-stack.triton.fullname" .) .Release.Namespace }}
{{- end }}

{{/* GPU_METRICS_URLS: Triton's metrics port through the headless Service (the gateway reads every pod; none with
cpuOnly), and the cluster's DCGM exporter with dcgmExporter.enabled. Empty: no GPU policy. */}}
{{- define "ai-stack.gpu.metricsUrls" -}}
{{- $urls := list }}
{{- if not .Values.cpuOnly }}
{{- $urls = append $urls (printf "http://%s-headless.%s.svc:8002/metrics" (include "ai-stack.triton.fullname" .) .Release.Namespace) }}
{{- end }}
{{- if .Values.dcgmExporter.enabled }}
{{- $urls = append $urls .Values.dcgmExporter.url }}
{{- end }}
{{- join "," $urls }}
{{- end }}

{{/* An image reference from {repository, tag, digest}: `repository@digest` when a digest is given (the tag then
only names it, as `repository:tag@digest`), else `repository:tag` with the chart's appVersion as the default tag. */}}
{{- define "ai-stack.imageRef" -}}
{{- $tag := default .appVersion .image.tag }}
{{- if .image.digest }}
{{- printf "%s:%s@%s" .image.repository $tag .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository $tag }}
{{- end }}
{{- end }}

{{- define "ai-stack.gateway.image" -}}
{{- include "ai-stack.imageRef" (dict "image" .Values.gateway.image "appVersion" .Chart.AppVersion) }}
{{- end }}

{{- define "ai-stack.triton.image" -}}
{{- include "ai-stack.imageRef" (dict "image" (ternary .Values.triton.cpuImage .Values.triton.image .Values.cpuOnly) "appVersion" .Chart.AppVersion) }}
{{- end }}

{{/* A memory size in bytes: a Kubernetes quantity (Ki, Mi, Gi, Ti; k, M, G, T) or a Redis size (kb, mb, gb: 1024s;
k, m, g: 1000s), a plain number being bytes. */}}
{{- define "ai-stack.bytes" -}}
{{- $text := toString . }}
{{- $match := regexFind "^[0-9.]+" $text }}
{{- $unit := lower (trimPrefix $match $text) }}
{{- $scale := dict "" 1 "b" 1 "k" 1000 "m" 1000000 "g" 1000000000 "t" 1000000000000 "ki" 1024 "kb" 1024 "mi" 1048576 "mb" 1048576 "gi" 1073741824 "gb" 1073741824 "ti" 1099511627776 }}
{{- if not (hasKey $scale $unit) }}
{{- fail (printf "%q is not a memory size (e.g. 512mb, 1Gi)" $text) }}
{{- end }}
{{- mulf (float64 $match) (index $scale $unit) | int64 }}
{{- end }}

{{/* Secret the gateway's own keys come from. */}}
{{- define "ai-stack.gateway.secretName" -}}
{{- default (include "ai-stack.gateway.fullname" .) .Values.gateway.existingSecret }}
{{- end }}

{{/* Secret and key of the bundled Redis' password. */}}
{{- define "ai-stack.redis.passwordSecretName" -}}
{{- default (include "ai-stack.redis.fullname" .) .Values.redis.auth.existingSecret }}
{{- end }}

{{- define "ai-stack.redis.passwordSecretKey" -}}
{{- ternary .Values.redis.auth.existingSecretKey "redis-password" (ne .Values.redis.auth.existingSecret "") }}
{{- end }}

{{/* Secret and key holding REDIS_URL; empty name: no Redis (in-process caches). With the bundled Redis'
password in an existing Secret there is none: the gateway builds the URL from the password (see the Deployment). */}}
{{- define "ai-stack.redis.urlSecretName" -}}
{{- if and .Values.redis.enabled .Values.redis.auth.existingSecret }}
{{- else if .Values.redis.enabled }}
{{- include "ai-stack.redis.fullname" . }}
{{- else if .Values.redis.external.existingSecret }}
{{- .Values.redis.external.existingSecret }}
{{- else if .Values.redis.external.url }}
{{- include "ai-stack.redis.fullname" . }}
{{- end }}
{{- end }}

{{- define "ai-stack.redis.urlSecretKey" -}}
{{- if and (not .Values.redis.enabled) .Values.redis.external.existingSecret }}
{{- .Values.redis.external.existingSecretKey }}
{{- else }}
{{- print "REDIS_URL" }}
{{- end }}
{{- end }}

{{/* The bundled Redis' password: the value, else the one already in the cluster, else a new one. A new one is
drawn once per render and kept in .Values, which every template of the render shares: the Secret and the checksums
on the Redis and gateway pods then hold the same password (each `include` would otherwise draw its own). Under
`helm template` (Argo CD) `lookup` finds nothing, so every render draws a new one and both pods roll with it. */}}
{{- define "ai-stack.redis.password" -}}
{{- if .Values.redis.auth.password }}
{{- .Values.redis.auth.password }}
{{- else }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "ai-stack.redis.fullname" .) }}
{{- if and $existing (hasKey $existing.data "redis-password") }}
{{- index $existing.data "redis-password" | b64dec }}
{{- else }}
{{- if not (hasKey .Values.redis.auth "drawnPassword") }}
{{- $_ := set .Values.redis.auth "drawnPassword" (randAlphaNum 32) }}
{{- end }}
{{- index .Values.redis.auth "drawnPassword" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "ai-stack.gateway.autoscalingMode" -}}
{{- if not .Values.gateway.autoscaling.enabled }}off{{- else if and (eq .Values.metricsAdapter.mode "keda") (include "ai-stack.metrics.adapterPresent" .) }}keda{{- else }}hpa{{- end }}
{{- end }}

{{/* "true" when the monitoring stack's `api` can be counted on: serviceMonitor.enabled true (e.g. `helm template` for
Argo CD, which sees no cluster), or "auto" on a cluster that serves it.
Call with (dict "ctx" $ "api" "<group/version[/kind]>"). */}}
{{- define "ai-stack.monitoring.has" -}}
{{- $enabled := toString .ctx.Values.serviceMonitor.enabled }}
{{- if or (eq $enabled "true") (and (eq $enabled "auto") (.ctx.Capabilities.APIVersions.Has .api)) }}true{{ end }}
{{- end }}

{{/* "true" when the chart renders its monitoring objects (ServiceMonitors, the adapter's rules): the Prometheus
operator is there. */}}
{{- define "ai-stack.monitoring.rendered" -}}
{{- include "ai-stack.monitoring.has" (dict "ctx" . "api" "monitoring.coreos.com/v1/ServiceMonitor") }}
{{- end }}

{{/* "true" when metricsAdapter.mode's adapter is there: prometheus-adapter's custom.metrics.k8s.io, or KEDA's
ScaledObject CRD. */}}
{{- define "ai-stack.metrics.adapterPresent" -}}
{{- $api := ternary "keda.sh/v1alpha1/ScaledObject" "custom.metrics.k8s.io/v1beta1" (eq .Values.metricsAdapter.mode "keda") }}
{{- if ne .Values.metricsAdapter.mode "none" }}{{ include "ai-stack.monitoring.has" (dict "ctx" . "api" $api) }}{{ end }}
{{- end }}

{{/* "true" when the autoscalers' pods metrics (the gateway's in-flight requests, Triton's queue time) will exist:
Prometheus scrapes the pods (the chart's ServiceMonitors, or serviceMonitor.scrapedOtherwise) and the adapter serves
them. Without it the gateway's HPA scales on CPU alone: an HPA with a missing metric never scales down. */}}
{{- define "ai-stack.metrics.podsMetric" -}}
{{- if and (include "ai-stack.metrics.adapterPresent" .) (or (include "ai-stack.monitoring.rendered" .) .Values.serviceMonitor.scrapedOtherwise) }}true{{ end }}
{{- end }}

{{/* HPA behaviour (shared by the HPA and KEDA's advanced.horizontalPodAutoscalerConfig). */}}
{{- define "ai-stack.gateway.hpaBehavior" -}}
{{- $b := .Values.gateway.autoscaling.behavior -}}
behavior:
  scaleUp:
    stabilizationWindowSeconds: {{ $b.scaleUp.stabilizationWindowSeconds }}
    selectPolicy: Max
    policies:
      - type: Pods
        value: {{ $b.scaleUp.pods }}
        periodSeconds: {{ $b.scaleUp.periodSeconds }}
  scaleDown:
    stabilizationWindowSeconds: {{ $b.scaleDown.stabilizationWindowSeconds }}
    selectPolicy: Min
    policies:
      - type: Pods
        value: {{ $b.scaleDown.pods }}
        periodSeconds: {{ $b.scaleDown.periodSeconds }}
{{- end }}

{{/* The name a gateway setting had before 0.2 (CHAT_* was HUNYUAN_*, VIDEO_* was PIKA_*), else "". Call with the name. */}}
{{- define "ai-stack.gateway.oldName" -}}
{{- if hasPrefix "CHAT_" . }}{{ printf "HUNYUAN_%s" (trimPrefix "CHAT_" .) }}{{ else if hasPrefix "VIDEO_" . }}{{ printf "PIKA_%s" (trimPrefix "VIDEO_" .) }}{{ end }}
{{- end }}

{{/* A setting's name from 0.2 on: HUNYUAN_* -> CHAT_*, PIKA_* -> VIDEO_*, any other name as it is. Call with the name. */}}
{{- define "ai-stack.gateway.newName" -}}
{{- if hasPrefix "HUNYUAN_" . }}{{ printf "CHAT_%s" (trimPrefix "HUNYUAN_" .) }}{{ else if hasPrefix "PIKA_" . }}{{ printf "VIDEO_%s" (trimPrefix "PIKA_" .) }}{{ else }}{{ . }}{{ end }}
{{- end }}

{{/* Whether the values still set `name` under its name from before 0.2: that value wins over the chart's default
under the new name (the ConfigMap carries it under the new name). Call with (dict "ctx" $ "name" "CHAT_BASE_URL"). */}}
{{- define "ai-stack.gateway.setUnderOldName" -}}
{{- $gw := .ctx.Values.gateway }}
{{- $old := include "ai-stack.gateway.oldName" .name }}
{{- if and $old (or (hasKey $gw.extraConfig $old) (hasKey $gw.config $old)) }}true{{ end }}
{{- end }}

{{/* One gateway setting as the ConfigMap carries it: gateway.extraConfig over gateway.config, its name from before
0.4 over both. Call with (dict "ctx" $ "name" "TASKS_SQLITE_PATH"). */}}
{{- define "ai-stack.gateway.setting" -}}
{{- $gw := .ctx.Values.gateway }}
{{- $name := .name }}
{{- if include "ai-stack.gateway.setUnderOldName" . }}{{ $name = include "ai-stack.gateway.oldName" .name }}{{ end }}
{{- if hasKey $gw.extraConfig $name }}{{ index $gw.extraConfig $name }}{{ else }}{{ index $gw.config $name | default "" }}{{ end }}
{{- end }}

{{/* GATEWAY_PUBLIC_URL: the value, else https://<first ingress host> when the ingress is on, else empty (polling). */}}
{{- define "ai-stack.gateway.publicUrl" -}}
{{- $url := include "ai-stack.gateway.setting" (dict "ctx" . "name" "GATEWAY_PUBLIC_URL") }}
{{- if $url }}
{{- $url }}
{{- else if .Values.ingress.enabled }}
{{- $host := "" }}
{{- range .Values.ingress.hosts }}
{{- if and (not $host) .host (not (hasPrefix "*" .host)) }}
{{- $host = .host }}
{{- end }}
{{- end }}
{{- with $host }}
{{- printf "https://%s" . }}
{{- end }}
{{- end }}
{{- end }}

{{/* "true" when the gateway has a Redis (bundled or external). */}}
{{- define "ai-stack.redis.used" -}}
{{- if or .Values.redis.enabled (include "ai-stack.redis.urlSecretName" .) }}true{{ end }}
{{- end }}

{{/* "true" when video tasks live in the SQLite file TASKS_SQLITE_PATH (no Redis), else empty. */}}
{{- define "ai-stack.gateway.tasksOnDisk" -}}
{{- if not (include "ai-stack.redis.used" .) }}true{{ end }}
{{- end }}

{{/* Folder of TASKS_SQLITE_PATH, where the gateway's task volume is mounted. */}}
{{- define "ai-stack.gateway.tasksDir" -}}
{{- $path := include "ai-stack.gateway.setting" (dict "ctx" . "name" "TASKS_SQLITE_PATH") }}
{{- if not (regexMatch "^/[^/].*/[^/]+$" $path) }}
{{- fail (printf "TASKS_SQLITE_PATH must be an absolute file path below a folder (the folder becomes a volume), not %q" $path) }}
{{- end }}
{{- if eq (dir $path) "/tmp" }}
{{- fail "TASKS_SQLITE_PATH: /tmp is the gateway's scratch volume (lost with the pod); use another folder, e.g. /var/lib/gateway" }}
{{- end }}
{{- dir $path }}
{{- end }}

{{/* "true" when search keeps its index in the embedded store in SEARCH_PATH (no Milvus), else empty. */}}
{{- define "ai-stack.search.embedded" -}}
{{- if and .Values.search.enabled (not .Values.search.milvus.uri) }}true{{ end }}
{{- end }}

{{/* The persistence block that makes the gateway's volume (TASKS_SQLITE_PATH's folder: the task database without
Redis, the embedded search index, the usage spool) a PVC, as JSON ("{}" for none): gateway.taskStore.persistence
without Redis, else search.persistence with the embedded store. The first keeps its claim when search is turned on
later, so the tasks it holds are not left behind on another volume. */}}
{{- define "ai-stack.gateway.persistence" -}}
{{- $tasks := .Values.gateway.taskStore.persistence }}
{{- $search := .Values.search.persistence }}
{{- if and (include "ai-stack.gateway.tasksOnDisk" .) $tasks.enabled }}
{{- toJson (merge (dict "name" "tasks") $tasks) }}
{{- else if and (include "ai-stack.search.embedded" .) $search.enabled }}
{{- toJson (merge (dict "name" "data") $search) }}
{{- else }}{}{{ end }}
{{- end }}

{{/* PVC that holds the gateway's volume (see ai-stack.gateway.persistence), else empty: the volume is an emptyDir. */}}
{{- define "ai-stack.gateway.tasksClaim" -}}
{{- $persistence := include "ai-stack.gateway.persistence" . | fromJson }}
{{- if $persistence }}
{{- default (printf "%s-%s" (include "ai-stack.gateway.fullname" .) $persistence.name) $persistence.existingClaim }}
{{- end }}
{{- end }}

{{/* Secret holding the keys file: gateway.keys.existingSecret, else the chart's when gateway.keys.file is set, else empty. */}}
{{- define "ai-stack.gateway.keysSecretName" -}}
{{- $keys := .Values.gateway.keys }}
{{- if $keys.existingSecret }}{{ $keys.existingSecret }}{{ else if $keys.file }}{{ include "ai-stack.gateway.fullname" . }}-keys{{ end }}
{{- end }}

{{/* Folder the keys file's Secret is mounted at; GATEWAY_KEYS_FILE is keys.yaml in it. */}}
{{- define "ai-stack.gateway.keysDir" -}}/etc/gateway/keys{{- end }}

{{/* Triton replicas without autoscaling: triton.replicaCount, else 2 on GPUs (a restart, rollout or drain leaves
one serving) and 1 with cpuOnly. */}}
{{- define "ai-stack.triton.replicas" -}}
{{- $count := .Values.triton.replicaCount }}
{{- if kindIs "invalid" $count }}{{ ternary 1 2 .Values.cpuOnly }}{{ else }}{{ int $count }}{{ end }}
{{- end }}

{{/* "true" when the gateway has API keys from a source the chart knows: gateway.secrets.GATEWAY_API_KEYS,
gateway.existingSecret (assumed to hold GATEWAY_API_KEYS), or a keys file (gateway.keys). */}}
{{- define "ai-stack.gateway.hasKeys" -}}
{{- if or .Values.gateway.existingSecret .Values.gateway.secrets.GATEWAY_API_KEYS (include "ai-stack.gateway.keysSecretName" .) }}true{{ end }}
{{- end }}

{{/* What publishes the gateway beyond the cluster (an Ingress, or a LoadBalancer or NodePort Service), else empty. */}}
{{- define "ai-stack.gateway.exposedBy" -}}
{{- $by := list }}
{{- if .Values.ingress.enabled }}{{ $by = append $by "ingress.enabled" }}{{ end }}
{{- if .Values.ingress.grpc.enabled }}{{ $by = append $by "ingress.grpc.enabled" }}{{ end }}
{{- if has .Values.gateway.service.type (list "LoadBalancer" "NodePort") }}{{ $by = append $by (printf "gateway.service.type=%s" .Values.gateway.service.type) }}{{ end }}
{{- join ", " $by }}
{{- end }}

{{/* A resource's `annotations:` block: commonAnnotations with the resource's own (`extra`, which win), or nothing
when both are empty. */}}
{{- define "ai-stack.annotations" -}}
{{- $annotations := merge (dict) (default (dict) .extra) .ctx.Values.commonAnnotations }}
{{- with $annotations -}}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The gateway's workload: a StatefulSet when each replica keeps its usage spool on a claim of its own
(gateway.usageSpool.persistence.enabled, with Redis, several replicas), else a Deployment. */}}
{{- define "ai-stack.gateway.kind" -}}
{{- if and .Values.gateway.usageSpool.persistence.enabled (include "ai-stack.redis.used" .) (not (include "ai-stack.gateway.tasksClaim" .)) }}StatefulSet{{ else }}Deployment{{ end }}
{{- end }}
