{{/* The one image, repository[:tag]. */}}
{{- define "stoke.image" -}}
{{- if .Values.image.tag -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- else -}}
{{ .Values.image.repository }}
{{- end -}}
{{- end -}}

{{/* The restricted Pod Security settings of every Stoke Pod. */}}
{{- define "stoke.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "stoke.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* The artifact store's flags, the same on the controller and the gateway. */}}
{{- define "stoke.artifactArgs" -}}
{{- with .Values.artifacts.s3 }}
{{- if .bucket }}
- --artifact-s3-bucket={{ .bucket }}
{{- with .prefix }}
- --artifact-s3-prefix={{ . }}
{{- end }}
{{- with .endpoint }}
- --artifact-s3-endpoint={{ . }}
{{- end }}
{{- with .region }}
- --artifact-s3-region={{ . }}
{{- end }}
{{- if .pathStyle }}
- --artifact-s3-path-style
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The artifact store's credentials: the Secret's keys as environment. */}}
{{- define "stoke.artifactEnvFrom" -}}
{{- if and .Values.artifacts.s3.bucket .Values.artifacts.s3.credentialsSecret }}
envFrom:
  - secretRef:
      name: {{ .Values.artifacts.s3.credentialsSecret }}
{{- end }}
{{- end -}}
