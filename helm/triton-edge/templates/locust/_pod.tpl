{{/* The pod spec shared by the Locust master and workers; .role is master or worker. */}}
{{- define "triton-edge.locustPod" -}}
{{- $ctx := .ctx -}}
{{- $v := $ctx.Values -}}
{{- $master := include "triton-edge.locustMaster" $ctx -}}
{{- $host := printf "http://%s:%v" (include "triton-edge.fullname" $ctx) $v.service.ports.http -}}
{{- $file := ternary "/locust/locustfile.py" $v.locust.locustfilePath (not (empty $v.locust.locustfile)) -}}
metadata:
  labels:
    {{- include "triton-edge.labels" $ctx | nindent 4 }}
    app.kubernetes.io/component: locust
    triton-edge/locust-role: {{ .role }}
  annotations:
    checksum/locustfile: {{ $v.locust.locustfile | sha256sum }}
spec:
  automountServiceAccountToken: false
  enableServiceLinks: false
  securityContext:
    {{- toYaml $v.podSecurityContext | nindent 4 }}
  {{- with $v.kit.image.pullSecrets }}
  imagePullSecrets:
    {{- range . }}
    - name: {{ . }}
    {{- end }}
  {{- end }}
  {{- with $v.locust.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.locust.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.locust.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: locust
      image: {{ include "triton-edge.kitImage" $ctx }}
      imagePullPolicy: {{ $v.kit.image.pullPolicy }}
      command: ["locust"]
      args:
        - -f
        - {{ $file }}
        - --host
        - {{ $host }}
        {{- if eq .role "master" }}
        - --master
        - --web-port
        - {{ $v.locust.webPort | quote }}
        {{- else }}
        - --worker
        - --master-host
        - {{ $master }}
        {{- end }}
      env:
        - name: TRITONKIT_MODEL
          value: {{ include "triton-edge.locustModel" $ctx | quote }}
        - name: HOME
          value: /tmp
        {{- with $v.locust.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- if eq .role "master" }}
      ports:
        - name: web
          containerPort: {{ $v.locust.webPort }}
          protocol: TCP
        - name: master
          containerPort: 5557
          protocol: TCP
      readinessProbe:
        httpGet:
          path: /
          port: web
        periodSeconds: 10
        timeoutSeconds: 5
      livenessProbe:
        httpGet:
          path: /
          port: web
        periodSeconds: 20
        timeoutSeconds: 5
        failureThreshold: 6
      resources:
        {{- toYaml $v.locust.masterResources | nindent 8 }}
      {{- else }}
      # A worker is useful only while it reaches its master.
      readinessProbe:
        exec:
          command: ["python3", "-c", "import socket; socket.create_connection(('{{ $master }}', 5557), 3).close()"]
        periodSeconds: 15
        timeoutSeconds: 5
      livenessProbe:
        exec:
          command: ["python3", "-c", "import socket; socket.create_connection(('{{ $master }}', 5557), 3).close()"]
        periodSeconds: 30
        timeoutSeconds: 5
        failureThreshold: 6
      resources:
        {{- toYaml $v.locust.workerResources | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $v.containerSecurityContext | nindent 8 }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
        {{- if $v.locust.locustfile }}
        - name: locustfile
          mountPath: /locust
          readOnly: true
        {{- end }}
  volumes:
    - name: tmp
      emptyDir:
        sizeLimit: 256Mi
    {{- if $v.locust.locustfile }}
    - name: locustfile
      configMap:
        name: {{ $master }}
    {{- end }}
{{- end -}}
