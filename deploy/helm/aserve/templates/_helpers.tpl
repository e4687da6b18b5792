{{/* Names and labels. */}}
{{- define "aserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "aserve.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "aserve.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "aserve.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "aserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "aserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "aserve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "aserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Interpreters: a whole number from 1 to 15 (the private engine's limit per process). */}}
{{- define "aserve.interpreters" -}}
{{- $n := int .Values.interpreters }}
{{- if or (lt $n 1) (gt $n 15) (ne (float64 $n) (float64 .Values.interpreters)) }}
{{- fail (printf "interpreters: expected a whole number from 1 to 15 (one interpreter per CPU, at most 15 per process), got %v" .Values.interpreters) }}
{{- end }}
{{- $n }}
{{- end }}

{{/* The container's resources: requests.cpu (and limits.cpu with cpuLimit) = interpreters. */}}
{{- define "aserve.resources" -}}
{{- $n := include "aserve.interpreters" . }}
{{- $requests := deepCopy (default dict .Values.resources.requests) }}
{{- $limits := deepCopy (default dict .Values.resources.limits) }}
{{- range $kind, $given := dict "requests" $requests "limits" $limits }}
{{- if hasKey $given "cpu" }}
{{- $cpu := toString (get $given "cpu") }}
{{- if not (or (eq $cpu $n) (eq $cpu (printf "%s000m" $n))) }}
{{- fail (printf "resources.%s.cpu is %s but interpreters is %s: aserve runs one interpreter per requested CPU; change interpreters alone (it sets the CPU request)" $kind $cpu $n) }}
{{- end }}
{{- end }}
{{- end }}
{{- $_ := set $requests "cpu" $n }}
{{- if .Values.resources.cpuLimit }}
{{- $_ := set $limits "cpu" $n }}
{{- end }}
requests:
  {{- toYaml $requests | nindent 2 }}
{{- if $limits }}
limits:
  {{- toYaml $limits | nindent 2 }}
{{- end }}
{{- end }}

{{/* Termination grace: above the drain plus the shutdown timeout. */}}
{{- define "aserve.terminationGrace" -}}
{{- $needed := add (int .Values.drainSeconds) (int .Values.shutdownTimeoutSeconds) }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add $needed 10 }}
{{- else if le (int .Values.terminationGracePeriodSeconds) $needed }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must be above drainSeconds + shutdownTimeoutSeconds (%d): the kubelet kills the pod when it runs out" .Values.terminationGracePeriodSeconds $needed) }}
{{- else }}
{{- int .Values.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/*
A probe's handler: `list . "ready"` or `list . "live"`. probes.type http GETs the health
route; grpc asks gRPC's health service (the service "" for readiness, "liveness").
*/}}
{{- define "aserve.probe" -}}
{{- $root := index . 0 -}}
{{- $what := index . 1 -}}
{{- $type := $root.Values.probes.type | default "http" -}}
{{- if eq $type "grpc" -}}
{{- if not $root.Values.grpc.enabled -}}
{{- fail "probes.type grpc needs grpc.enabled: the probes ask the gRPC front's health service" -}}
{{- end -}}
grpc:
  port: {{ int $root.Values.grpc.port }}
  service: {{ ternary "" "liveness" (eq $what "ready") | quote }}
{{- else if eq $type "http" -}}
httpGet:
  path: {{ ternary "/v2/health/ready" "/v2/health/live" (eq $what "ready") }}
  port: http
{{- else -}}
{{- fail (printf "probes.type: expected http or grpc, got %q" $type) -}}
{{- end -}}
{{- end -}}
