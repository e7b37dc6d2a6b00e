{{/* Chart name, truncated to 63 characters (a DNS label). */}}
{{- define "nnrp-vllm-gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release plus chart, unless the release already contains it. */}}
{{- define "nnrp-vllm-gateway.fullname" -}}
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

{{- define "nnrp-vllm-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nnrp-vllm-gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "nnrp-vllm-gateway.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "nnrp-vllm-gateway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: nnrp-vllm-gateway
{{- end }}

{{/* Fleet mode: the headless Service's name (a DNS label: 63 characters at most). */}}
{{- define "nnrp-vllm-gateway.fleetServiceName" -}}
{{- printf "%s-fleet" (include "nnrp-vllm-gateway.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{/* Fleet mode: where the key Secret's key is mounted, a file of its own. */}}
{{- define "nnrp-vllm-gateway.fleetKeyFile" -}}
/etc/nnrp-fleet/key
{{- end }}

{{/* The metrics-only Service's name (a DNS label: 63 characters at most). */}}
{{- define "nnrp-vllm-gateway.metricsServiceName" -}}
{{- printf "%s-metrics" (include "nnrp-vllm-gateway.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{/* Session auth: where the token Secret's key is mounted, a file of its own. */}}
{{- define "nnrp-vllm-gateway.authTokenFile" -}}
/etc/nnrp-auth/tokens
{{- end }}

{{/* TLS: where the kubernetes.io/tls Secret (tls.crt, tls.key) is mounted. */}}
{{- define "nnrp-vllm-gateway.tlsDir" -}}
/etc/nnrp-tls
{{- end }}

{{/* Session auth is required: a token Secret, or an explicit allowUnauthenticated. The
Secret is the user's, as the fleet key's is (a token generated here would change on every
render); an empty key is the gateway's to refuse at start-up (it fails closed). QUIC needs
the TLS Secret; it is checked first, as the more particular mistake. */}}
{{- define "nnrp-vllm-gateway.securityChecks" -}}
{{- if and .Values.gateway.quicPort (not .Values.gateway.tls.secretName) }}
{{- fail "gateway.quicPort needs gateway.tls.secretName (a kubernetes.io/tls Secret): QUIC is always TLS" }}
{{- end }}
{{- $auth := .Values.gateway.auth }}
{{- if and $auth.allowUnauthenticated $auth.tokenSecret.name }}
{{- fail "gateway.auth.allowUnauthenticated=true and gateway.auth.tokenSecret.name are both set: keep the token Secret (session auth on) or drop it (auth off), not both" }}
{{- end }}
{{- if not (or $auth.allowUnauthenticated $auth.tokenSecret.name) }}
{{- fail "gateway.auth.tokenSecret.name is required: an existing Secret holding the session tokens clients must present, e.g. kubectl create secret generic nnrp-tokens --from-literal=tokens=$(openssl rand -hex 32), then --set gateway.auth.tokenSecret.name=nnrp-tokens; or set gateway.auth.allowUnauthenticated=true to let every client that reaches the NNRP ports use vLLM without a token" }}
{{- end }}
{{- if $auth.tokenSecret.name }}
{{- $_ := required "gateway.auth.tokenSecret.key must name the key within the Secret gateway.auth.tokenSecret.name" $auth.tokenSecret.key }}
{{- end }}
{{- end }}

{{/* Fleet mode's values, refused early with what to do: the key Secret is the user's
(a key generated here would change on every render, or need a lookup that helm template
and GitOps tools cannot do), and the fleet port must be a port of its own. */}}
{{- define "nnrp-vllm-gateway.fleetChecks" -}}
{{- if .Values.fleet.enabled }}
{{- $_ := required "fleet.enabled needs fleet.keySecret.name: an existing Secret holding the fleet's shared key, e.g. kubectl create secret generic nnrp-fleet-key --from-literal=key=$(openssl rand -hex 32) (docs/fleet.md)" .Values.fleet.keySecret.name }}
{{- $_ := required "fleet.keySecret.key must name the key within the Secret fleet.keySecret.name" .Values.fleet.keySecret.key }}
{{- $port := int .Values.fleet.port }}
{{- range $name, $taken := dict "gateway.port" .Values.gateway.port "gateway.wsPort" .Values.gateway.wsPort "gateway.adminPort" .Values.gateway.adminPort "vllm.port" .Values.vllm.port }}
{{- if eq $port (int $taken) }}
{{- fail (printf "fleet.port (%d) is %s's TCP port: forwarded resumes need a port of their own" $port $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Seconds of the vLLM container's preStop sleep (0: no hook). vllm.preStopSleepSeconds
when set; unset or null: in container mode the gateway's preStop sleep plus its drain
timeout, so that vLLM gets its SIGTERM only once the gateway has drained and keeps
generating for the operations the drain finishes; in native mode 0, since the gateway, a
sidecar, gets its preStop and SIGTERM only once vLLM has exited: a sleep there only
postpones the drain (values.yaml, vllm.preStopSleepSeconds). */}}
{{- define "nnrp-vllm-gateway.vllmPreStopSleepSeconds" -}}
{{- $explicit := .Values.vllm.preStopSleepSeconds -}}
{{- if not (kindIs "invalid" $explicit) -}}
{{- int $explicit -}}
{{- else if eq .Values.sidecarMode "container" -}}
{{- add .Values.gateway.preStopSleepSeconds .Values.gateway.drainTimeoutSeconds -}}
{{- else -}}
0
{{- end -}}
{{- end }}

{{- define "nnrp-vllm-gateway.metrics" -}}
{{- if or .Values.gateway.metrics .Values.serviceMonitor.enabled }}true{{ end }}
{{- end }}

{{/* The gateway's resources: what values give, the rest sized by gateway.workers (a
worker is one process, busy up to one core, some 60-100Mi resident under load). */}}
{{- define "nnrp-vllm-gateway.gatewayResources" -}}
{{- $workers := int .Values.gateway.workers -}}
{{- $resources := deepCopy (.Values.gateway.resources | default dict) -}}
{{- $requests := get $resources "requests" | default dict -}}
{{- if not (hasKey $requests "cpu") -}}
{{- $_ := set $requests "cpu" (ternary "250m" (toString $workers) (eq $workers 1)) -}}
{{- end -}}
{{- if not (hasKey $requests "memory") -}}
{{- $_ := set $requests "memory" (printf "%dMi" (mul 128 $workers)) -}}
{{- end -}}
{{- $limits := get $resources "limits" | default dict -}}
{{- if not (hasKey $limits "memory") -}}
{{- $_ := set $limits "memory" (printf "%dMi" (mul 512 $workers)) -}}
{{- end -}}
{{- $_ := set $resources "requests" $requests -}}
{{- $_ := set $resources "limits" $limits -}}
{{- toYaml $resources -}}
{{- end }}

{{/* The gateway container; rendered under initContainers (native) or containers. */}}
{{- define "nnrp-vllm-gateway.gatewayContainer" -}}
- name: gateway
  image: "{{ .Values.gateway.image.repository }}:{{ .Values.gateway.image.tag | default .Chart.AppVersion }}"
  {{- with .Values.gateway.image.pullPolicy }}
  imagePullPolicy: {{ . }}
  {{- end }}
  {{- if eq .Values.sidecarMode "native" }}
  restartPolicy: Always
  {{- end }}
  {{- $tls := .Values.gateway.tls.secretName }}
  args:
    - --listen
    - {{ ternary "tcps" "tcp" (not (empty $tls)) }}://0.0.0.0:{{ .Values.gateway.port }}
    {{- if .Values.gateway.wsPort }}
    - --listen
    - {{ ternary "wss" "ws" (not (empty $tls)) }}://0.0.0.0:{{ .Values.gateway.wsPort }}/nnrp
    {{- end }}
    {{- if .Values.gateway.quicPort }}
    - --listen
    - quic://0.0.0.0:{{ .Values.gateway.quicPort }}
    - --quic-alpn
    - {{ .Values.gateway.quicAlpn | quote }}
    {{- end }}
    {{- if $tls }}
    - --tls-cert
    - {{ include "nnrp-vllm-gateway.tlsDir" . }}/tls.crt
    - --tls-key
    - {{ include "nnrp-vllm-gateway.tlsDir" . }}/tls.key
    {{- end }}
    {{- if .Values.gateway.auth.tokenSecret.name }}
    - --auth-token-file
    - {{ include "nnrp-vllm-gateway.authTokenFile" . }}
    {{- end }}
    - --vllm-url
    - http://127.0.0.1:{{ .Values.vllm.port }}
    - --admin-listen
    - 0.0.0.0:{{ .Values.gateway.adminPort }}
    - --drain-timeout
    - {{ .Values.gateway.drainTimeoutSeconds | quote }}
    - --resume-window
    - {{ .Values.gateway.resumeWindowSeconds | quote }}
    {{- if gt (int .Values.gateway.workers) 1 }}
    - --workers
    - {{ .Values.gateway.workers | quote }}
    {{- end }}
    {{- if include "nnrp-vllm-gateway.metrics" . }}
    - --metrics
    {{- end }}
    {{- if .Values.gateway.toolCalls }}
    - --tool-calls
    {{- end }}
    - --overload-retry-after-ms
    - {{ .Values.gateway.overloadRetryAfterMs | quote }}
    {{- with .Values.gateway.loadAwareAdmission }}
    {{- if .enabled }}
    - --load-aware-admission
    - --load-source
    - {{ .source | quote }}
    - --load-interval
    - {{ .intervalSeconds | quote }}
    {{- if .maxWaiting }}
    - --load-max-waiting
    - {{ .maxWaiting | quote }}
    {{- end }}
    {{- if .maxKvCacheUsage }}
    - --load-max-kv-cache-usage
    - {{ .maxKvCacheUsage | quote }}
    {{- end }}
    - --load-retry-after-ms
    - {{ .retryAfterMs | quote }}
    - --load-max-retry-after-ms
    - {{ .maxRetryAfterMs | quote }}
    {{- if .refuseSessions }}
    - --load-refuse-sessions
    {{- end }}
    {{- end }}
    {{- end }}
    {{- if .Values.media.enabled }}
    - --media-dir
    - {{ .Values.media.mountPath | quote }}
    - --media-dir-bytes
    - {{ .Values.media.maxBytes | int64 | quote }}
    {{- end }}
    {{- range .Values.gateway.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  env:
    - name: PYTHONDONTWRITEBYTECODE
      value: "1"
    {{- if .Values.fleet.enabled }}
    # Fleet mode: the other gateways reach this one at the pod's IP for forwarded resumes
    # (Kubernetes expands $(POD_IP) only from an entry listed before it); the key is the
    # Secret's, a file the kubelet keeps current and SIGHUP re-reads.
    - name: POD_IP
      valueFrom:
        fieldRef:
          fieldPath: status.podIP
    - name: NNRP_GATEWAY_FLEET_ADVERTISE
      value: "$(POD_IP):{{ .Values.fleet.port }}"
    - name: NNRP_GATEWAY_FLEET_KEY_FILE
      value: {{ include "nnrp-vllm-gateway.fleetKeyFile" . | quote }}
    {{- end }}
    {{- if .Values.gateway.upstreamApiKeySecret }}
    - name: NNRP_GATEWAY_UPSTREAM_API_KEY
      valueFrom:
        secretKeyRef:
          name: {{ .Values.gateway.upstreamApiKeySecret }}
          key: api-key
    {{- end }}
    {{- with .Values.gateway.tracing }}
    {{- if .enabled }}
    - name: NNRP_GATEWAY_OTEL_TRACES
      value: "1"
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    - name: OTEL_SERVICE_NAME
      value: {{ include "nnrp-vllm-gateway.fullname" $ | quote }}
    - name: OTEL_RESOURCE_ATTRIBUTES
      value: "k8s.namespace.name=$(POD_NAMESPACE),k8s.pod.name=$(POD_NAME)"
    {{- with .endpoint }}
    - name: OTEL_EXPORTER_OTLP_ENDPOINT
      value: {{ . | quote }}
    {{- end }}
    - name: OTEL_TRACES_SAMPLER
      value: {{ .sampler | quote }}
    {{- with .samplerArg }}
    - name: OTEL_TRACES_SAMPLER_ARG
      value: {{ . | quote }}
    {{- end }}
    {{- with .headersSecret }}
    - name: OTEL_EXPORTER_OTLP_HEADERS
      valueFrom:
        secretKeyRef:
          name: {{ . }}
          key: headers
    {{- end }}
    {{- end }}
    {{- end }}
    {{- with .Values.gateway.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: nnrp
      containerPort: {{ .Values.gateway.port }}
      protocol: TCP
    {{- if .Values.gateway.wsPort }}
    - name: nnrp-ws
      containerPort: {{ .Values.gateway.wsPort }}
      protocol: TCP
    {{- end }}
    {{- if .Values.gateway.quicPort }}
    - name: nnrp-quic
      containerPort: {{ .Values.gateway.quicPort }}
      protocol: UDP
    {{- end }}
    - name: admin
      containerPort: {{ .Values.gateway.adminPort }}
      protocol: TCP
    {{- if .Values.fleet.enabled }}
    - name: fleet
      containerPort: {{ .Values.fleet.port }}
      protocol: TCP
    {{- end }}
  # Startup and liveness never depend on vLLM: in native mode a vLLM-dependent startup
  # probe would block vLLM from ever starting; readiness does follow vLLM.
  startupProbe:
    httpGet: {path: /healthz, port: admin}
    periodSeconds: 2
    timeoutSeconds: {{ .Values.gateway.probeTimeoutSeconds }}
    failureThreshold: 30
  livenessProbe:
    httpGet: {path: /healthz, port: admin}
    periodSeconds: 10
    timeoutSeconds: {{ .Values.gateway.probeTimeoutSeconds }}
    failureThreshold: 3
  readinessProbe:
    httpGet: {path: /readyz, port: admin}
    periodSeconds: 5
    timeoutSeconds: {{ .Values.gateway.probeTimeoutSeconds }}
    failureThreshold: 2
  lifecycle:
    preStop:
      sleep:
        seconds: {{ .Values.gateway.preStopSleepSeconds }}
  resources:
    {{- include "nnrp-vllm-gateway.gatewayResources" . | nindent 4 }}
  securityContext:
    {{- toYaml .Values.gateway.securityContext | nindent 4 }}
  volumeMounts:
    - name: tmp
      mountPath: /tmp
    {{- if .Values.gateway.tls.secretName }}
    - name: tls
      mountPath: {{ include "nnrp-vllm-gateway.tlsDir" . }}
      readOnly: true
    {{- end }}
    {{- if .Values.gateway.auth.tokenSecret.name }}
    - name: auth-tokens
      mountPath: {{ include "nnrp-vllm-gateway.authTokenFile" . | dir }}
      readOnly: true
    {{- end }}
    {{- if .Values.fleet.enabled }}
    - name: fleet-key
      mountPath: {{ include "nnrp-vllm-gateway.fleetKeyFile" . | dir }}
      readOnly: true
    {{- end }}
    {{- if .Values.media.enabled }}
    - name: media
      mountPath: {{ .Values.media.mountPath }}
    {{- end }}
    {{- with .Values.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}
