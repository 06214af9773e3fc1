{{/* Names, labels and the image reference shared by every template. */}}

{{- define "tidal.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-tidal, or the release name when it already contains the chart name. */}}
{{- define "tidal.fullname" -}}
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

{{- define "tidal.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tidal.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tidal.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "tidal.labels" -}}
helm.sh/chart: {{ include "tidal.chart" . }}
{{ include "tidal.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: tidal
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "tidal.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tidal.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tidal.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The runtime image per backend for TIDAL_OPERATOR_RUNTIME_IMAGES: backend=repository:tag,...
(a tag left empty is the chart's appVersion).
*/}}
{{- define "tidal.runtimeImages" -}}
{{- $pairs := list }}
{{- range $backend, $image := .Values.runtimeImages }}
{{- $pairs = append $pairs (printf "%s=%s:%s" $backend $image.repository (default $.Chart.AppVersion $image.tag)) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}

{{/*
The operator's own API rights, derived from operator/shell (see charts/README.md):
  - kopf watches InferenceServices and the labelled children (list, watch);
  - kube.py server-side applies ConfigMaps, Services and Deployments (patch, and create: an
    apply that creates the object is also authorised as create), patches the status
    subresource and creates core/v1 Events;
  - children carry an ownerReference with blockOwnerDeletion, which clusters running the
    OwnerReferencesPermissionEnforcement admission plugin authorise as an update of the
    owner's finalizers subresource.
Pods are watched (status and the control loop follow them) and patched: the control loop sets
their serving/standby role label and the pod-deletion-cost annotation (a merge patch of
metadata only). The Services' EndpointSlices are watched: a traffic move takes the old pods
out only once the slices list the new ones as ready.
Nothing is ever deleted by the operator: children go with their owner (garbage collector).
*/}}
{{- define "tidal.operatorRules" -}}
- apiGroups: ["serving.tidal.dev"]
  resources: ["inferenceservices"]
  verbs: ["list", "watch"]
- apiGroups: ["serving.tidal.dev"]
  resources: ["inferenceservices/status"]
  verbs: ["patch"]
- apiGroups: ["serving.tidal.dev"]
  resources: ["inferenceservices/finalizers"]
  verbs: ["update"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["list", "watch", "create", "patch"]
# get: the fleet loop reads back its saved forecast (<isvc>-fleet-state) after a restart.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "patch"]
# Traffic moves wait until the Service's EndpointSlices list the new pods ready (read only).
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# ModelBuilds: one build Job per target (runtime/BUILD.md); their pods' termination messages
# carry the builder's verdicts (pods: list, watch above).
- apiGroups: ["serving.tidal.dev"]
  resources: ["modelbuilds"]
  verbs: ["list", "watch"]
- apiGroups: ["serving.tidal.dev"]
  resources: ["modelbuilds/status"]
  verbs: ["patch"]
- apiGroups: ["serving.tidal.dev"]
  resources: ["modelbuilds/finalizers"]
  verbs: ["update"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["list", "watch", "create"]
{{- end }}

{{/*
kopf's cluster observation: it lists and watches CRDs to notice resources appearing, and — when
it watches named namespaces — lists and watches namespaces (read-only; without them kopf only
logs warnings and uses what it found at start).
*/}}
{{- define "tidal.discoveryRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
# A ModelBuild's default targets are the GPU products among the nodes' labels (read only).
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list"]
{{- if .Values.watchNamespaces }}
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
{{- end }}

{{/*
"true" when the runtime PodMonitor is installed: runtimeMetrics.podMonitor.enabled true, or auto
(the default) on a cluster that serves the Prometheus Operator's PodMonitor.
*/}}
{{- define "tidal.runtimePodMonitor" -}}
{{- $want := toString .Values.runtimeMetrics.podMonitor.enabled -}}
{{- $api := .Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PodMonitor" -}}
{{- if or (eq $want "true") (and (eq $want "auto") $api) -}}
true
{{- else -}}
false
{{- end -}}
{{- end }}

{{/* The model store's objects (modelStore.enabled): their selector and labels. */}}
{{- define "tidal.modelStoreSelectorLabels" -}}
app.kubernetes.io/name: {{ include "tidal.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: model-store
{{- end }}

{{- define "tidal.modelStoreLabels" -}}
helm.sh/chart: {{ include "tidal.chart" . }}
{{ include "tidal.modelStoreSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: tidal
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "tidal.modelStoreName" -}}
{{- printf "%s-model-store" (include "tidal.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The Secret holding the store's keys in the release namespace: the user's or the chart's. */}}
{{- define "tidal.modelStoreSecret" -}}
{{- if .Values.modelStore.enabled }}
{{- default (include "tidal.modelStoreName" .) .Values.modelStore.credentials.existingSecret }}
{{- else }}
{{- .Values.modelStore.external.credentialsSecret }}
{{- end }}
{{- end }}

{{/* The S3 endpoint of the store, as InferenceServices and the upload name it. */}}
{{- define "tidal.modelStoreEndpoint" -}}
{{- if .Values.modelStore.enabled }}
{{- printf "http://%s.%s.svc" .Values.modelStore.serviceName .Release.Namespace }}
{{- else }}
{{- .Values.modelStore.external.endpoint }}
{{- end }}
{{- end }}
