{{/* The gateway's NetworkPolicy, for a default-deny namespace: in from the ingress controller (HTTP, gRPC)
and the scrapers (HTTP: /metrics); out to DNS, Triton's gRPC port, Redis, Milvus and HTTPS upstreams. */}}
{{- define "ai-stack.gateway.networkPolicy" -}}
{{- $np := .Values.networkPolicy }}
{{- $gw := .Values.gateway }}
{{- $selector := include "ai-stack.selectorLabels" (dict "ctx" $ "component" "gateway") }}
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ include "ai-stack.gateway.fullname" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "ai-stack.labels" (dict "ctx" $ "component" "gateway") | nindent 4 }}
spec:
  podSelector:
    matchLabels:
      {{- $selector | nindent 6 }}
  policyTypes: ["Ingress", "Egress"]
  ingress:
    - {{- with $np.ingressFrom }}
      from:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      ports:
        - port: http
          protocol: TCP
        - port: grpc
          protocol: TCP
    - {{- with $np.metricsFrom }}
      from:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      ports:
        - port: http
          protocol: TCP
  egress:
    - {{- with $np.dnsTo }}
      to:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      ports:
        - port: 53
          protocol: UDP
        - port: 53
          protocol: TCP
    - to:
        - podSelector:
            matchLabels:
              {{- include "ai-stack.selectorLabels" (dict "ctx" $ "component" "triton") | nindent 14 }}
      ports:
        - port: 8001
          protocol: TCP
    {{- if .Values.redis.enabled }}
    - to:
        - podSelector:
            matchLabels:
              {{- include "ai-stack.selectorLabels" (dict "ctx" $ "component" "redis") | nindent 14 }}
      ports:
        - port: 6379
          protocol: TCP
    {{- else if include "ai-stack.redis.used" . }}
    - {{- with $np.externalTo }}
      to:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      ports:
        - port: {{ $np.externalRedisPort }}
          protocol: TCP
    {{- end }}
    {{- if and .Values.search.enabled .Values.search.milvus.uri }}
    {{- $milvus := urlParse .Values.search.milvus.uri }}
    {{- $port := regexFind "[0-9]+$" $milvus.host | default (ternary "443" "19530" (eq $milvus.scheme "https")) }}
    - {{- with $np.externalTo }}
      to:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      ports:
        - port: {{ int $port }}
          protocol: TCP
    {{- end }}
    - {{- with $np.httpsTo }}
      to:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      ports:
        - port: 443
          protocol: TCP
{{- end }}
