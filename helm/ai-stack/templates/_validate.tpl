{{/* Combinations the chart refuses, each with the fix in its message. Included once, by the gateway's
Deployment (a failure there fails the whole render). */}}
{{- define "ai-stack.validate" -}}
{{- $gw := .Values.gateway }}
{{- $as := $gw.autoscaling }}
{{- $t := .Values.triton }}
{{- $mode := include "ai-stack.gateway.autoscalingMode" . }}
{{- $config := merge (dict) $gw.extraConfig $gw.config }}
{{- if and $as.enabled (gt (int $as.minReplicas) (int $as.maxReplicas)) }}
{{- fail (printf "gateway.autoscaling.minReplicas (%d) is above maxReplicas (%d): lower minReplicas or raise maxReplicas" (int $as.minReplicas) (int $as.maxReplicas)) }}
{{- end }}
{{- if and $t.autoscaling.enabled (gt (int $t.autoscaling.minReplicas) (int $t.autoscaling.maxReplicas)) }}
{{- fail (printf "triton.autoscaling.minReplicas (%d) is above maxReplicas (%d): lower minReplicas or raise maxReplicas" (int $t.autoscaling.minReplicas) (int $t.autoscaling.maxReplicas)) }}
{{- end }}
{{- if and (ne $mode "off") (ne .Values.metricsAdapter.mode "none") (eq (toString .Values.serviceMonitor.enabled) "false") (not .Values.serviceMonitor.scrapedOtherwise) }}
{{- fail "gateway autoscaling uses the pods metric http_requests_in_flight, which exists only if Prometheus scrapes the gateway (without it the HPA never scales down): set serviceMonitor.enabled=true, or serviceMonitor.scrapedOtherwise=true if your Prometheus scrapes the pods another way, or metricsAdapter.mode=none to scale on CPU alone" }}
{{- end }}
{{- if and (ne $mode "off") (not (include "ai-stack.redis.used" .)) (not $as.allowWithoutRedis) }}
{{- fail "gateway autoscaling without Redis gives each replica its own video tasks, caches and upstream quota: set redis.enabled=true or redis.external.url, or gateway.autoscaling.allowWithoutRedis=true to accept that, or gateway.autoscaling.enabled=false" }}
{{- end }}
{{- if and $t.autoscaling.enabled (not (include "ai-stack.metrics.podsMetric" .)) }}
{{- fail "triton.autoscaling scales on the pods metric triton_queue_duration_us_per_request, which needs Prometheus to scrape Triton and prometheus-adapter to serve it: install them (see the chart's README, Monitoring) with serviceMonitor.enabled=auto, or set serviceMonitor.enabled=true where the cluster cannot be asked (helm template), or triton.autoscaling.enabled=false" }}
{{- end }}
{{- $rwo := and (eq $t.modelRepository.source "pvc") (has "ReadWriteOnce" $t.modelRepository.pvc.accessModes) (not (has "ReadOnlyMany" $t.modelRepository.pvc.accessModes)) }}
{{- if and $rwo (or $t.autoscaling.enabled (gt (int (include "ai-stack.triton.replicas" .)) 1)) }}
{{- fail "triton.modelRepository.pvc is ReadWriteOnce: a second Triton pod on another node cannot mount it (Multi-Attach error, Pending pods): use triton.modelRepository.source=image or objectStorage, or a ReadOnlyMany volume (pvc.accessModes: [ReadOnlyMany]), or triton.replicaCount=1 without triton.autoscaling" }}
{{- end }}
{{- $drain := add $t.preStop.unreadySeconds $t.preStop.inFlightWaitSeconds 30 }}
{{- if le (int $t.terminationGracePeriodSeconds) (int $drain) }}
{{- fail (printf "triton.terminationGracePeriodSeconds (%v) must exceed triton.preStop.unreadySeconds + inFlightWaitSeconds + 30 (Triton's own exit timeout after SIGTERM) = %d: raise it, or the drain is cut short" $t.terminationGracePeriodSeconds (int $drain)) }}
{{- end }}
{{- $shutdown := float64 (default "0" (index $config "GATEWAY_SHUTDOWN_GRACE_SECONDS")) }}
{{- if le (float64 $gw.terminationGracePeriodSeconds) (addf (float64 $gw.preStopSleepSeconds) $shutdown) }}
{{- fail (printf "gateway.terminationGracePeriodSeconds (%v) must exceed preStopSleepSeconds + GATEWAY_SHUTDOWN_GRACE_SECONDS (%v): raise it, or streams are killed before they drain" $gw.terminationGracePeriodSeconds (addf (float64 $gw.preStopSleepSeconds) $shutdown)) }}
{{- end }}
{{- $keepalive := float64 (default "0" (index $config "GATEWAY_KEEPALIVE_SECONDS")) }}
{{- if and .Values.ingress.enabled (le $keepalive (float64 .Values.ingress.upstreamKeepaliveSeconds)) }}
{{- fail (printf "GATEWAY_KEEPALIVE_SECONDS (%v) must exceed ingress.upstreamKeepaliveSeconds (%v): otherwise the gateway closes idle connections the proxy still sends on (sporadic 502)" $keepalive .Values.ingress.upstreamKeepaliveSeconds) }}
{{- end }}
{{- with index $config "GATEWAY_PRICES" }}
{{- if not (regexMatch "^\\s*\\{" (toString .)) }}
{{- fail "GATEWAY_PRICES must be a JSON object by model, e.g. '{\"hy3-preview\": {\"input\": 1.2, \"output\": 4.8}}' (docs/configuration.md)" }}
{{- end }}
{{- if hasKey (fromJson (toString .)) "Error" }}
{{- fail "GATEWAY_PRICES is not valid JSON: e.g. '{\"hy3-preview\": {\"input\": 1.2, \"output\": 4.8}}' (docs/configuration.md)" }}
{{- end }}
{{- end }}
{{- with include "ai-stack.gateway.exposedBy" . }}
{{- if and (not (include "ai-stack.gateway.hasKeys" $)) (not $gw.allowUnauthenticated) }}
{{- fail (printf "%s publishes the gateway with no API keys: anyone who reaches it spends your chat and video accounts. Set gateway.secrets.GATEWAY_API_KEYS, gateway.existingSecret or a keys file (gateway.keys), or gateway.allowUnauthenticated=true to publish it open anyway" .) }}
{{- end }}
{{- end }}
{{- $redis := .Values.redis }}
{{- with and $redis.enabled $redis.resources.limits $redis.resources.limits.memory }}
{{- if lt (int64 (include "ai-stack.bytes" .)) (mul 2 (int64 (include "ai-stack.bytes" $redis.maxmemory))) }}
{{- fail (printf "redis.resources.limits.memory (%s) must be at least twice redis.maxmemory (%s): rewriting the append-only file forks Redis, and the copy grows with every write meanwhile (OOM kill); raise the limit or lower maxmemory" . $redis.maxmemory) }}
{{- end }}
{{- end }}
{{- $search := .Values.search }}
{{- if and $search.enabled (not $search.milvus.uri) }}
{{- if or (ne $mode "off") (gt (int $gw.replicaCount) 1) }}
{{- fail "search without search.milvus.uri keeps its index in an embedded store in SEARCH_PATH, on one pod's volume: other replicas would not see it; set search.milvus.uri, or gateway.autoscaling.enabled=false and gateway.replicaCount=1" }}
{{- end }}
{{- if not (hasPrefix (printf "%s/" (include "ai-stack.gateway.tasksDir" .)) $search.path) }}
{{- fail (printf "search.path (%s) must be below %s, the gateway's volume (TASKS_SQLITE_PATH's folder)" $search.path (include "ai-stack.gateway.tasksDir" .)) }}
{{- end }}
{{- end }}
{{- end }}
