{{/* Names, labels and the values every service shares. */}}

{{- define "prime-swarm.labels" -}}
app.kubernetes.io/part-of: prime-swarm
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "prime-swarm.selector" -}}
app.kubernetes.io/part-of: prime-swarm
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The image of one service extra (deploy/docker/Dockerfile, EXTRA build argument). */}}
{{- define "prime-swarm.image" -}}
{{ .root.Values.image.repository }}-{{ .extra }}:{{ .root.Values.image.tag }}
{{- end }}

{{/* redis://USER:PASSWORD@HOST:PORT/DB with the password from the role's secret key. */}}
{{- define "prime-swarm.redisEnv" -}}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .root.Values.redis.passwordSecret }}
      key: {{ .user }}
- name: {{ .var }}
  value: "redis://{{ .user }}:$(REDIS_PASSWORD)@{{ required "redis.host is required" .root.Values.redis.host }}:{{ .root.Values.redis.port }}/{{ .root.Values.redis.db }}"
{{- end }}

{{- define "prime-swarm.recipeEnv" -}}
- {name: PRIME_RECIPE_ENV, value: {{ .Values.recipe.env | quote }}}
- {name: PRIME_RECIPE_GROUP_SIZE, value: {{ .Values.recipe.groupSize | quote }}}
- {name: PRIME_RECIPE_TEMPERATURE, value: {{ .Values.recipe.temperature | quote }}}
- {name: PRIME_RECIPE_MAX_NEW_TOKENS, value: {{ .Values.recipe.maxNewTokens | quote }}}
- {name: PRIME_RECIPE_ASYNC_LEVEL, value: {{ .Values.recipe.asyncLevel | quote }}}
{{- end }}

{{- define "prime-swarm.relayUrls" -}}
{{- $urls := list -}}
{{- range $i := until (int .Values.relays.replicas) -}}
{{- $urls = append $urls (printf "http://relay-%d.relay:%d" $i (int $.Values.relays.port)) -}}
{{- end -}}
{{ toJson $urls }}
{{- end }}
