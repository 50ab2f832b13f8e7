{{/* Names. Kubernetes limits names to 63 characters (DNS label). */}}
{{- define "triton-edge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "triton-edge.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A component's name: <fullname>-<suffix>, shortened so the suffix always survives. */}}
{{- define "triton-edge.componentName" -}}
{{- $suffix := .suffix -}}
{{- printf "%s-%s" (include "triton-edge.fullname" .ctx | trunc (int (sub 62 (len $suffix))) | trimSuffix "-") $suffix -}}
{{- end -}}

{{- define "triton-edge.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every resource. */}}
{{- define "triton-edge.labels" -}}
helm.sh/chart: {{ include "triton-edge.chart" . }}
app.kubernetes.io/name: {{ include "triton-edge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: triton-edge-kit
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels. `component` separates Triton from the Locust pods of the same release. */}}
{{- define "triton-edge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "triton-edge.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "triton-edge.annotations" -}}
{{- with .Values.commonAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Image references. A digest pins the image and wins over the tag. */}}
{{- define "triton-edge.imageRef" -}}
{{- $repo := .repository -}}
{{- if .registry -}}{{- $repo = printf "%s/%s" .registry .repository -}}{{- end -}}
{{- if .digest -}}
{{- printf "%s@%s" $repo .digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (toString .tag) -}}
{{- end -}}
{{- end -}}

{{- define "triton-edge.flavor" -}}
{{- if .Values.image.flavor -}}
{{- .Values.image.flavor -}}
{{- else if eq .Values.platform "jetson" -}}
py3-igpu
{{- else -}}
py3
{{- end -}}
{{- end -}}

{{- define "triton-edge.image" -}}
{{- $img := .Values.image -}}
{{- include "triton-edge.imageRef" (dict "registry" $img.registry "repository" $img.repository "digest" $img.digest "tag" (printf "%s-%s" (toString $img.tag) (include "triton-edge.flavor" .))) -}}
{{- end -}}

{{- define "triton-edge.kitImage" -}}
{{- include "triton-edge.imageRef" .Values.kit.image -}}
{{- end -}}

{{/* The fetch init container defaults to the Triton image: it is on the node already and has python3. */}}
{{- define "triton-edge.fetchImage" -}}
{{- if .Values.engines.fetch.image.repository -}}
{{- include "triton-edge.imageRef" .Values.engines.fetch.image -}}
{{- else -}}
{{- include "triton-edge.image" . -}}
{{- end -}}
{{- end -}}

{{- define "triton-edge.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "triton-edge.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "triton-edge.secretName" -}}
{{- default (include "triton-edge.componentName" (dict "ctx" . "suffix" "auth")) .Values.auth.existingSecret -}}
{{- end -}}

{{- define "triton-edge.engineClaim" -}}
{{- default (include "triton-edge.componentName" (dict "ctx" . "suffix" "engines")) .Values.engines.pvc.existingClaim -}}
{{- end -}}

{{/* Models in the repository, sorted so renders are stable. */}}
{{- define "triton-edge.modelNames" -}}
{{- keys .Values.modelRepository.configs | sortAlpha | join "," -}}
{{- end -}}

{{/* Models the tuner sidecars watch: tuner.models, else models, else every configured model. */}}
{{- define "triton-edge.tunerModels" -}}
{{- $models := .Values.tuner.models | default .Values.models -}}
{{- if not $models }}{{ $models = keys .Values.modelRepository.configs | sortAlpha }}{{ end -}}
{{- join "," $models -}}
{{- end -}}

{{/* A tuner container's name: model names may hold `_`, `.` and capitals, container names are DNS labels. */}}
{{- define "triton-edge.tunerContainer" -}}
{{- printf "tuner-%s" (. | lower | replace "_" "-" | replace "." "-") | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Models the tune Job tunes, one after another: tune.models, else models, else every configured model. */}}
{{- define "triton-edge.tuneModels" -}}
{{- $models := .Values.tune.models | default .Values.models -}}
{{- if not $models }}{{ $models = keys .Values.modelRepository.configs | sortAlpha }}{{ end -}}
{{- join "," $models -}}
{{- end -}}

{{/* The tune Job's name ends with the release revision: a Job's pod template is immutable, so every
install or upgrade with tune.enabled creates a new Job (Helm deletes the previous one) instead of
patching a finished one. `tritonkit deploy --tune` builds the same name (helm/tune_job.py). */}}
{{- define "triton-edge.tuneJob" -}}
{{- include "triton-edge.componentName" (dict "ctx" . "suffix" (printf "tune-%d" (int .Release.Revision))) -}}
{{- end -}}

{{/* The tuner rewrites config.pbtxt in place, so with a tuner the repository is a writable copy. */}}
{{- define "triton-edge.writableRepository" -}}
{{- if .Values.tuner.enabled -}}true{{- end -}}
{{- end -}}

{{/* Refuse values that would render a pod Triton cannot serve from. */}}
{{- define "triton-edge.validate" -}}
{{- if and (eq .Values.engines.source "fetch") (not .Values.engines.fetch.url) (not .Values.engines.fetch.urlSecret.name) -}}
{{- fail "engines.source=fetch needs engines.fetch.url or engines.fetch.urlSecret.name" -}}
{{- end -}}
{{- range .Values.models -}}
{{- if not (hasKey $.Values.modelRepository.configs .) -}}
{{- fail (printf "models lists %q, which has no entry in modelRepository.configs" .) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.pdb.create .Values.pdb.minAvailable .Values.pdb.maxUnavailable -}}
{{- fail "pdb: set minAvailable or maxUnavailable, not both" -}}
{{- end -}}
{{- if and .Values.tuner.enabled (not .Values.modelRepository.spec) -}}
{{- fail "tuner.enabled needs modelRepository.spec (the deploy.yaml text; `tritonkit deploy` sets it)" -}}
{{- end -}}
{{- if .Values.tuner.enabled -}}
{{- $seen := dict -}}
{{- range splitList "," (include "triton-edge.tunerModels" .) -}}
{{- if not (hasKey $.Values.modelRepository.configs .) -}}
{{- fail (printf "tuner.models lists %q, which has no entry in modelRepository.configs" .) -}}
{{- end -}}
{{- $c := include "triton-edge.tunerContainer" . -}}
{{- if hasKey $seen $c -}}
{{- fail (printf "tuner: models %q and %q both map to the container name %q; rename one, or list one in tuner.models" (get $seen $c) . $c) -}}
{{- end -}}
{{- $_ := set $seen $c . -}}
{{- end -}}
{{- end -}}
{{- if .Values.tune.enabled -}}
{{- if not .Values.modelRepository.spec -}}
{{- fail "tune.enabled needs modelRepository.spec (the deploy.yaml text; `tritonkit deploy --tune` sets it)" -}}
{{- end -}}
{{- if not .Values.modelRepository.configs -}}
{{- fail "tune.enabled needs at least one model in modelRepository.configs" -}}
{{- end -}}
{{- if or .Values.autoscaling.enabled (ne (int .Values.replicaCount) 1) -}}
{{- fail "tune.enabled needs one Triton pod (replicaCount 1, autoscaling.enabled false): through the Service the tune's requests and its shadow model's load would land on different pods" -}}
{{- end -}}
{{- range splitList "," (include "triton-edge.tuneModels" .) -}}
{{- if not (hasKey $.Values.modelRepository.configs .) -}}
{{- fail (printf "tune.models lists %q, which has no entry in modelRepository.configs" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if .Values.engines.build.enabled -}}
{{- if lt (int .Values.gpu.count) 1 -}}
{{- fail "engines.build.enabled needs gpu.count >= 1: TensorRT builds an engine on the GPU that serves it (or serve ONNX on the CPU: deploy.gpus: 0 in deploy.yaml)" -}}
{{- end -}}
{{- if not .Values.engines.build.plan -}}
{{- fail "engines.build.enabled needs engines.build.plan (the build plan JSON; `tritonkit deploy` sets it)" -}}
{{- end -}}
{{- range .Values.engines.build.models -}}
{{- if not (hasKey $.Values.modelRepository.configs .) -}}
{{- fail (printf "engines.build.models lists %q, which has no entry in modelRepository.configs" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and .Values.locust.enabled (not (include "triton-edge.locustModel" .)) -}}
{{- fail "locust.enabled needs locust.model or at least one model in modelRepository.configs" -}}
{{- end -}}
{{- if and .Values.gateway.enabled (not .Values.gateway.bootstrap) -}}
{{- fail "gateway.enabled needs gateway.bootstrap (Envoy's bootstrap JSON; `tritonkit deploy` writes it from server.gateway in deploy.yaml)" -}}
{{- end -}}
{{- if .Values.gateway.enabled -}}
{{- $gp := list (int .Values.gateway.ports.traffic) (int .Values.gateway.ports.probes) (int .Values.gateway.ports.admin) -}}
{{- $sp := list (int .Values.server.ports.http) (int .Values.server.ports.grpc) (int .Values.server.ports.metrics) -}}
{{- range $gp -}}
{{- if has . $sp -}}
{{- fail (printf "gateway.ports: %d is also one of server.ports; Envoy and Triton share the pod's network, so pick another" .) -}}
{{- end -}}
{{- end -}}
{{- if ne (len (uniq $gp)) 3 -}}
{{- fail "gateway.ports: traffic, probes and admin must differ" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.autoscaling.enabled (lt (int .Values.autoscaling.maxReplicas) (int .Values.autoscaling.minReplicas)) -}}
{{- fail "autoscaling.maxReplicas must be at least autoscaling.minReplicas" -}}
{{- end -}}
{{- end -}}

{{/* tritonserver arguments. $(TRITON_KEY) is expanded by the kubelet from the Secret-backed env var. */}}
{{- define "triton-edge.serverArgs" -}}
{{- $s := .Values.server -}}
{{- $restricted := printf "model-repository:%s=$(TRITON_KEY)" .Values.auth.header -}}
- --model-repository={{ .Values.modelRepository.mountPath }}
- --model-control-mode=explicit
{{- $models := .Values.models -}}
{{- if not $models }}{{ $models = keys .Values.modelRepository.configs | sortAlpha }}{{ end }}
{{- range $models }}
- --load-model={{ . }}
{{- end }}
- --strict-readiness={{ $s.strictReadiness }}
- --exit-timeout-secs={{ $s.exitTimeoutSeconds }}
- --http-port={{ $s.ports.http }}
- --grpc-port={{ $s.ports.grpc }}
- --metrics-port={{ $s.ports.metrics }}
{{- if .Values.gateway.enabled }}
{{- /* Behind the gateway Triton listens on the pod's loopback only: Envoy is the way in. */}}
- --http-address=127.0.0.1
- --grpc-address=127.0.0.1
- --metrics-address=127.0.0.1
{{- end }}
- --allow-metrics=true
- --allow-gpu-metrics={{ and $s.gpuMetrics (gt (int .Values.gpu.count) 0) }}
- --allow-cpu-metrics=true
{{- if $s.summaryLatencies }}
- --metrics-config=summary_latencies=true
{{- end }}
- --http-restricted-api={{ $restricted }}
- --grpc-restricted-protocol={{ $restricted }}
{{- if $s.responseCache.enabled }}
- --cache-config=local,size={{ mul (int $s.responseCache.sizeMB) 1048576 }}
{{- end }}
- --log-verbose={{ $s.logVerbose }}
{{- range $s.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* Engine volume mounts: each model's version folder, read-only, under the repository; an engine
built on the node comes from the engine cache, where the build container put it. */}}
{{- define "triton-edge.engineMounts" -}}
{{- $root := .Values.modelRepository.mountPath -}}
{{- $built := ternary .Values.engines.build.models list .Values.engines.build.enabled -}}
{{- range keys .Values.modelRepository.configs | sortAlpha }}
{{- if has . $built }}
- name: engine-cache
  mountPath: {{ printf "%s/%s/1" $root . }}
  subPath: {{ printf "served/%s/1" . }}
  readOnly: true
{{- else }}
- name: engines
  mountPath: {{ printf "%s/%s/1" $root . }}
  subPath: {{ printf "%s/1" . }}
  readOnly: true
{{- end }}
{{- end }}
{{- end -}}

{{- define "triton-edge.buildImage" -}}
{{- $img := .Values.engines.build.image -}}
{{- include "triton-edge.imageRef" (dict "registry" $img.registry "repository" $img.repository "digest" $img.digest "tag" (default (printf "%s-py3" (toString .Values.image.tag)) (toString $img.tag))) -}}
{{- end -}}

{{- define "triton-edge.cacheClaim" -}}
{{- default (include "triton-edge.componentName" (dict "ctx" . "suffix" "engine-cache")) .Values.engines.build.cache.pvc.existingClaim -}}
{{- end -}}

{{/* The init container that builds engines on the node (files/build_engines.py): it sees the GPU the
pod is given, reads the version folders' ONNX and writes the cache; it never runs as root. */}}
{{- define "triton-edge.buildContainer" -}}
- name: build-engines
  image: {{ include "triton-edge.buildImage" . }}
  imagePullPolicy: {{ .Values.engines.build.image.pullPolicy }}
  command: ["python3", "/build/build_engines.py"]
  env:
    - name: BUILD_PLAN
      value: /build/plan.json
    - name: BUILD_SOURCE
      value: /engines
    - name: BUILD_CACHE
      value: /cache
    - name: BUILD_OUT
      value: /cache/served
    - name: HOME
      value: /tmp
  resources:
    {{- $res := deepCopy .Values.engines.build.resources }}
    {{- if gt (int .Values.gpu.count) 0 }}
    {{- $limits := default dict $res.limits }}
    {{- $_ := set $limits .Values.gpu.resourceName (int .Values.gpu.count) }}
    {{- $_ := set $res "limits" $limits }}
    {{- end }}
    {{- toYaml $res | nindent 4 }}
  securityContext:
    {{- toYaml .Values.containerSecurityContext | nindent 4 }}
  volumeMounts:
    - name: engines
      mountPath: /engines
      readOnly: true
    - name: engine-cache
      mountPath: /cache
    - name: build-script
      mountPath: /build
      readOnly: true
    - name: tmp
      mountPath: /tmp
{{- end -}}

{{- define "triton-edge.cacheVolume" -}}
- name: engine-cache
{{- if eq .Values.engines.build.cache.source "hostPath" }}
  hostPath:
    path: {{ .Values.engines.build.cache.hostPath.path }}
    type: DirectoryOrCreate
{{- else }}
  persistentVolumeClaim:
    claimName: {{ include "triton-edge.cacheClaim" . }}
{{- end }}
{{- end -}}

{{- define "triton-edge.engineVolume" -}}
- name: engines
{{- if eq .Values.engines.source "hostPath" }}
  hostPath:
    path: {{ .Values.engines.hostPath.path }}
    type: {{ .Values.engines.hostPath.type }}
{{- else if eq .Values.engines.source "pvc" }}
  persistentVolumeClaim:
    claimName: {{ include "triton-edge.engineClaim" . }}
    readOnly: true
{{- else }}
  emptyDir:
    sizeLimit: {{ .Values.engines.fetch.sizeLimit }}
{{- end }}
{{- if .Values.engines.build.enabled }}
{{ include "triton-edge.cacheVolume" . }}
{{- end }}
{{- end -}}

{{/* The init container that downloads and checks the engine archive into the `engines` emptyDir:
the Triton pod's, and the tune Job's (which reads the same version folders). */}}
{{- define "triton-edge.fetchContainer" -}}
- name: fetch-engines
  image: {{ include "triton-edge.fetchImage" . }}
  imagePullPolicy: {{ .Values.engines.fetch.image.pullPolicy }}
  command: ["python3", "/fetch/fetch_engines.py"]
  env:
    - name: FETCH_DEST
      value: /engines
    - name: FETCH_SHA256
      value: {{ .Values.engines.fetch.sha256 | quote }}
    - name: FETCH_MODELS
      value: {{ include "triton-edge.modelNames" . | quote }}
    {{- if .Values.engines.fetch.urlSecret.name }}
    - name: FETCH_URL
      valueFrom:
        secretKeyRef:
          name: {{ .Values.engines.fetch.urlSecret.name }}
          key: {{ .Values.engines.fetch.urlSecret.key }}
    {{- else }}
    - name: FETCH_URL
      value: {{ .Values.engines.fetch.url | quote }}
    {{- end }}
    - name: HOME
      value: /tmp
  resources:
    {{- toYaml .Values.engines.fetch.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.containerSecurityContext | nindent 4 }}
  volumeMounts:
    - name: engines
      mountPath: /engines
    - name: fetch-script
      mountPath: /fetch
      readOnly: true
    - name: tmp
      mountPath: /tmp
{{- end -}}

{{- define "triton-edge.fetchScriptVolume" -}}
- name: fetch-script
  configMap:
    name: {{ include "triton-edge.componentName" (dict "ctx" . "suffix" "fetch") }}
{{- end -}}

{{- define "triton-edge.locustMaster" -}}
{{- include "triton-edge.componentName" (dict "ctx" . "suffix" "locust") -}}
{{- end -}}

{{- define "triton-edge.locustModel" -}}
{{- default (first (keys .Values.modelRepository.configs | sortAlpha)) .Values.locust.model -}}
{{- end -}}

{{/* Text as a YAML block scalar that round-trips exactly (generated files are compared byte for
byte): explicit indentation for text that starts with spaces, keep or strip the final newline. */}}
{{- define "triton-edge.blockScalar" -}}
{{- $text := .text -}}
{{- $chomp := ternary "" "-" (hasSuffix "\n" $text) -}}
{{- if hasSuffix "\n\n" $text }}{{ $chomp = "+" }}{{ end -}}
|2{{ $chomp }}{{ $text | trimSuffix "\n" | nindent .indent }}
{{- end -}}

{{/* Where the kubelet probes Triton: its HTTP port, or behind the gateway the probe listener,
which forwards only the health endpoints and /metrics, outside admission. */}}
{{- define "triton-edge.probePort" -}}
{{- if .Values.gateway.enabled -}}{{ .Values.gateway.ports.probes }}{{- else -}}http{{- end -}}
{{- end -}}

{{/* The Service's target for inference, HTTP and gRPC: Triton's ports, or the gateway's one. */}}
{{- define "triton-edge.inferencePort" -}}
{{- if .Values.gateway.enabled -}}gateway{{- else -}}{{ .port }}{{- end -}}
{{- end -}}

{{/* Envoy in front of Triton, hardened like the other containers. Its admin stays on the loopback:
it can stop Envoy. */}}
{{- define "triton-edge.gatewayContainer" -}}
- name: gateway
  image: {{ include "triton-edge.imageRef" .Values.gateway.image }}
  imagePullPolicy: {{ .Values.gateway.image.pullPolicy }}
  command: ["envoy"]
  args:
    - -c
    - /etc/envoy/envoy.json
    - --concurrency
    - {{ .Values.gateway.concurrency | quote }}
    - --disable-hot-restart
    - --log-level
    - warn
  ports:
    - name: gateway
      containerPort: {{ .Values.gateway.ports.traffic }}
      protocol: TCP
    - name: metrics
      containerPort: {{ .Values.gateway.ports.probes }}
      protocol: TCP
  readinessProbe:
    tcpSocket:
      port: gateway
    periodSeconds: 5
    timeoutSeconds: 3
  livenessProbe:
    tcpSocket:
      port: metrics
    periodSeconds: 10
    timeoutSeconds: 5
    failureThreshold: 6
  resources:
    {{- toYaml .Values.gateway.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.containerSecurityContext | nindent 4 }}
  volumeMounts:
    - name: gateway-config
      mountPath: /etc/envoy
      readOnly: true
    - name: tmp
      mountPath: /tmp
{{- end -}}
