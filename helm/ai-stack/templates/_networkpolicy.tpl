{{/* The TCP port a client of this URL dials: its explicit port, else the one .defaults names for its scheme,
else .default. A URL without a scheme (host:port, as the OTLP exporter takes) is read as //host:port. Call with
(dict "url" $url "default" "6379" "defaults" (dict "https" "443")). */}}
{{- define "ai-stack.networkPolicy.urlPort" -}}
{{- $url := trim .url }}
{{- if not (contains "://" $url) }}
{{- $url = printf "//%s" $url }}
{{- end }}
{{- $u := urlParse $url }}
{{- $port := regexFind ":[0-9]+$" $u.host | trimPrefix ":" }}
{{- $port | default (get (.defaults | default dict) $u.scheme) | default .default }}
{{- end }}

{{/* Port of the Redis the gateway uses; empty: none over TCP. redis-py dials 6379 for redis:// and rediss://
alike; a URL in an existing Secret cannot be read, hence networkPolicy.externalRedisPort. */}}
{{- define "ai-stack.networkPolicy.redisPort" -}}
{{- $ext := .Values.redis.external }}
{{- if .Values.redis.enabled }}
{{- print "6379" }}
{{- else if $ext.existingSecret }}
{{- .Values.networkPolicy.externalRedisPort }}
{{- else if and $ext.url (not (hasPrefix "unix:" $ext.url)) }}
{{- include "ai-stack.networkPolicy.urlPort" (dict "url" $ext.url "default" "6379") }}
{{- end }}
{{- end }}

{{/* Ports of the gateway's HTTP upstreams (the chat upstream and its backups, fal), as a JSON list. */}}
{{- define "ai-stack.networkPolicy.upstreamPorts" -}}
{{- $urls := list }}
{{- range $name := list "CHAT_BASE_URL" "CHAT_BACKUP_BASE_URLS" "VIDEO_BASE_URL" "VIDEO_PLATFORM_URL" "VIDEO_WEBHOOK_JWKS_URL" }}
{{- $urls = concat $urls (splitList "," (include "ai-stack.gateway.setting" (dict "ctx" $ "name" $name))) }}
{{- end }}
{{- /* Zero-padded so that sortAlpha orders them as numbers. */}}
{{- $padded := list }}
{{- range $urls }}
{{- if trim . }}
{{- $port := include "ai-stack.networkPolicy.urlPort" (dict "url" . "default" "443" "defaults" (dict "https" "443" "http" "80")) }}
{{- $padded = append $padded (printf "%05d" (atoi $port)) }}
{{- end }}
{{- end }}
{{- $ports := list }}
{{- range $padded | uniq | sortAlpha }}
{{- $ports = append $ports (atoi .) }}
{{- end }}
{{- $ports | toJson }}
{{- end }}

{{/* One egress rule on TCP ports towards peers (none: any address). Call with (dict "to" $peers "ports" $ports). */}}
{{- define "ai-stack.networkPolicy.egressRule" -}}
- {{- with .to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    {{- range .ports }}
    - port: {{ int . }}
      protocol: TCP
    {{- end }}
{{- end }}

{{/* DNS for every component: kube-dns (networkPolicy.dnsTo) and NodeLocal DNSCache, whose link-local address
no pod selector matches. With dnsTo empty any address is allowed, node-local ones included. */}}
{{- define "ai-stack.networkPolicy.dnsRule" -}}
{{- $np := .Values.networkPolicy }}
{{- $to := list }}
{{- if $np.dnsTo }}
{{- $to = $np.dnsTo }}
{{- range $np.nodeLocalDnsCidrs }}
{{- $to = append $to (dict "ipBlock" (dict "cidr" .)) }}
{{- end }}
{{- end }}
- {{- with $to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
{{- end }}

{{/* The gateway's NetworkPolicy, for a default-deny namespace: in from the in-cluster clients and the ingress
controller (HTTP, gRPC) and the scrapers (HTTP: /metrics); out to DNS, Triton's gRPC port (and its metrics port for
the GPU policy, unless cpuOnly), Redis, Milvus, the OTLP collector, the DCGM exporter (dcgmExporter.enabled) and the
HTTP upstreams, each on the port of its configured URL. */}}
{{- define "ai-stack.gateway.networkPolicy" -}}
{{- $np := .Values.networkPolicy }}
{{- $selector := include "ai-stack.selectorLabels" (dict "ctx" $ "component" "gateway") }}
{{- $clients := $np.clientsFrom | default list }}
{{- if or .Values.ingress.enabled .Values.ingress.grpc.enabled }}
{{- $clients = concat $clients ($np.ingressFrom | default list) }}
{{- end }}
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ include "ai-stack.gateway.fullname" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "ai-stack.labels" (dict "ctx" $ "component" "gateway") | nindent 4 }}
  {{- include "ai-stack.annotations" (dict "ctx" $) | nindent 2 }}
spec:
  podSelector:
    matchLabels:
      {{- $selector | nindent 6 }}
  policyTypes: ["Ingress", "Egress"]
  ingress:
    {{- with $clients }}
    - from:
        {{- toYaml . | nindent 8 }}
      ports:
        - port: http
          protocol: TCP
        - port: grpc
          protocol: TCP
    {{- end }}
    - {{- with $np.metricsFrom }}
      from:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      ports:
        - port: http
          protocol: TCP
  egress:
    {{- include "ai-stack.networkPolicy.dnsRule" . | nindent 4 }}
    - to:
        - podSelector:
            matchLabels:
              {{- include "ai-stack.selectorLabels" (dict "ctx" $ "component" "triton") | nindent 14 }}
      ports:
        - port: 8001
          protocol: TCP
        {{- if not .Values.cpuOnly }}
        - port: 8002
          protocol: TCP
        {{- end }}
    {{- if .Values.redis.enabled }}
    - to:
        - podSelector:
            matchLabels:
              {{- include "ai-stack.selectorLabels" (dict "ctx" $ "component" "redis") | nindent 14 }}
      ports:
        - port: 6379
          protocol: TCP
    {{- else }}
    {{- with include "ai-stack.networkPolicy.redisPort" . }}
    {{- include "ai-stack.networkPolicy.egressRule" (dict "to" $np.externalTo "ports" (list .)) | nindent 4 }}
    {{- end }}
    {{- end }}
    {{- if and .Values.search.enabled .Values.search.milvus.uri }}
    {{- /* pymilvus dials 443 for https://, else 19530, when the URI has no port. */}}
    {{- $port := include "ai-stack.networkPolicy.urlPort" (dict "url" .Values.search.milvus.uri "default" "19530" "defaults" (dict "https" "443")) }}
    {{- include "ai-stack.networkPolicy.egressRule" (dict "to" $np.externalTo "ports" (list $port)) | nindent 4 }}
    {{- end }}
    {{- with include "ai-stack.gateway.setting" (dict "ctx" . "name" "OTEL_EXPORTER_OTLP_ENDPOINT") }}
    {{- /* The gRPC exporter passes only host[:port] on; gRPC dials 443 when there is no port. */}}
    {{- $port := include "ai-stack.networkPolicy.urlPort" (dict "url" . "default" "443") }}
    {{- include "ai-stack.networkPolicy.egressRule" (dict "to" $np.externalTo "ports" (list $port)) | nindent 4 }}
    {{- end }}
    {{- if .Values.dcgmExporter.enabled }}
    {{- $port := include "ai-stack.networkPolicy.urlPort" (dict "url" .Values.dcgmExporter.url "default" "80" "defaults" (dict "https" "443")) }}
    {{- include "ai-stack.networkPolicy.egressRule" (dict "to" .Values.dcgmExporter.networkPolicyPeers "ports" (list $port)) | nindent 4 }}
    {{- end }}
    {{- with include "ai-stack.networkPolicy.upstreamPorts" . | fromJsonArray }}
    {{- include "ai-stack.networkPolicy.egressRule" (dict "to" $np.httpsTo "ports" .) | nindent 4 }}
    {{- end }}
{{- end }}
