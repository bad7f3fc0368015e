{{/*
Names, labels and values derived once, for every template. Component objects are named
"<fullname>-<component>"; cluster-scoped objects carry the same prefix so two releases never clash
(except the DeviceClass, whose name is the driver's).
*/}}

{{- define "tessera.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tessera.fullname" -}}
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

{{/* The DRA driver's name, which is also the DeviceClass's (tessera/names.py). */}}
{{- define "tessera.driverName" -}}gpu.tessera.dev{{- end -}}

{{- define "tessera.kubeletPlugin.name" -}}{{ include "tessera.fullname" . | trunc 49 | trimSuffix "-" }}-kubeletplugin{{- end -}}
{{- define "tessera.webhook.name" -}}{{ include "tessera.fullname" . | trunc 55 | trimSuffix "-" }}-webhook{{- end -}}
{{- define "tessera.exporter.name" -}}{{ include "tessera.fullname" . | trunc 54 | trimSuffix "-" }}-exporter{{- end -}}
{{- define "tessera.webhook.tlsSecret" -}}{{ include "tessera.webhook.name" . }}-tls{{- end -}}
{{- /* The Secret the replicas keep their certificate in (webhook.tls.source secret): a name apart from
the chart's and cert-manager's, so that switching source never hands the replicas a Secret Helm owns. */ -}}
{{- define "tessera.webhook.sharedTlsSecret" -}}{{ include "tessera.webhook.name" . }}-shared-tls{{- end -}}
{{- define "tessera.webhook.host" -}}{{ include "tessera.webhook.name" . }}.{{ .Release.Namespace }}.svc{{- end -}}
{{- define "tessera.webview.name" -}}{{ include "tessera.fullname" . | trunc 55 | trimSuffix "-" }}-webview{{- end -}}
{{- define "tessera.admissionCheck.name" -}}{{ include "tessera.fullname" . | trunc 48 | trimSuffix "-" }}-admissioncheck{{- end -}}
{{/* The AdmissionCheck object (cluster-scoped): the name ClusterQueues list to use the check. */}}
{{- define "tessera.admissionCheck.checkName" -}}{{ include "tessera.fullname" . | trunc 55 | trimSuffix "-" }}-gpu-fit{{- end -}}
{{/* Kueue's API the queue objects are written in; the chart refuses them where it is not served. */}}
{{- define "tessera.kueueAPI" -}}kueue.x-k8s.io/v1beta2{{- end -}}
{{- define "tessera.testNamespace" -}}{{ include "tessera.fullname" . | trunc 58 | trimSuffix "-" }}-test{{- end -}}

{{- define "tessera.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "tessera.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tessera
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels of one component's objects: include with (dict "root" $ "component" "webhook"). */}}
{{- define "tessera.componentLabels" -}}
{{ include "tessera.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tessera.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tessera.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tessera.image" -}}
{{- $tag := .image.tag | default .root.Chart.AppVersion -}}
{{- printf "%s:%s" .image.repository $tag -}}
{{- end -}}

{{/*
Host paths of the node daemon. A path under hostPaths.nodeRoot is reached through the nodeRoot mount
and needs none of its own; "tessera.underNodeRoot" answers "true" or "".
*/}}
{{- define "tessera.underNodeRoot" -}}
{{- $root := .root.Values.kubeletPlugin.hostPaths.nodeRoot | trimSuffix "/" -}}
{{- if and $root (hasPrefix (printf "%s/" $root) .path) -}}true{{- end -}}
{{- end -}}

{{/* The daemon may pick its own mounts (own, or auto without the toolkit's spec): it must then see
the host's device nodes, which only a privileged container does. */}}
{{- define "tessera.kubeletPlugin.privileged" -}}
{{- if ne .Values.kubeletPlugin.driverSource "nvidia-toolkit" -}}true{{- end -}}
{{- end -}}

{{/*
The node's host folders and files that the plugin and the exporter mount one by one (those not
under hostPaths.nodeRoot, which its own mount reaches), as JSON {"mounts": [{name, path, type,
readOnly}]}: one list, so the two DaemonSets cannot disagree on a path. Use with fromJson.
*/}}
{{- define "tessera.node.hostMounts" -}}
{{- $root := . -}}
{{- $p := .Values.kubeletPlugin -}}
{{- $h := $p.hostPaths -}}
{{- $privileged := include "tessera.kubeletPlugin.privileged" . -}}
{{- $mounts := list -}}
{{- $mounts = append $mounts (dict "name" "plugins-registry" "path" (printf "%s/plugins_registry" $h.kubeletRoot) "type" "DirectoryOrCreate" "readOnly" false) -}}
{{- $mounts = append $mounts (dict "name" "plugins" "path" (printf "%s/plugins" $h.kubeletRoot) "type" "DirectoryOrCreate" "readOnly" false) -}}
{{- $mounts = append $mounts (dict "name" "cdi" "path" $h.cdiDir "type" "DirectoryOrCreate" "readOnly" false) -}}
{{- $mounts = append $mounts (dict "name" "state" "path" $h.stateDir "type" "DirectoryOrCreate" "readOnly" false) -}}
{{- $mounts = append $mounts (dict "name" "nvml" "path" (printf "%s/libnvidia-ml.so.1" $h.driverLibraryDir) "type" "File" "readOnly" true) -}}
{{- if $privileged -}}
{{- $mounts = append $mounts (dict "name" "cuda" "path" (printf "%s/libcuda.so.1" $h.driverLibraryDir) "type" "File" "readOnly" true) -}}
{{- if ne $h.deviceDir "/dev" -}}
{{- $mounts = append $mounts (dict "name" "devices" "path" $h.deviceDir "type" "Directory" "readOnly" true) -}}
{{- end -}}
{{- end -}}
{{- if eq $p.driverSource "auto" -}}
{{- /* auto looks for NVIDIA's toolkit spec in the standard CDI folders too. */ -}}
{{- range $i, $dir := list "/etc/cdi" "/var/run/cdi" -}}
{{- if ne $dir $h.cdiDir -}}
{{- $mounts = append $mounts (dict "name" (printf "toolkit-cdi-%d" $i) "path" $dir "type" "DirectoryOrCreate" "readOnly" true) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if ne $h.bootIdFile "/proc/sys/kernel/random/boot_id" -}}
{{- $mounts = append $mounts (dict "name" "boot-id" "path" $h.bootIdFile "type" "File" "readOnly" true) -}}
{{- end -}}
{{- $own := list -}}
{{- range $mounts -}}
{{- if not (include "tessera.underNodeRoot" (dict "root" $root "path" .path)) -}}
{{- $own = append $own . -}}
{{- end -}}
{{- end -}}
{{- dict "mounts" $own | toJson -}}
{{- end -}}

{{- define "tessera.webhook.configurationName" -}}{{ include "tessera.webhook.name" . }}{{- end -}}

{{/*
The chart-made CA and serving certificate (webhook.tls.source chart), as a dict of PEM strings
(ca, cert, key). Kept from the release's Secret when it exists, so upgrades keep the CA the API
server trusts; made once per render otherwise (the Secret and the webhook configuration must agree,
so the result is remembered for the rest of the render).
*/}}
{{- define "tessera.webhook.chartTLS" -}}
{{- $memo := .Values.webhook.tls.chart -}}
{{- if not (hasKey $memo "_material") -}}
{{- $material := dict -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "tessera.webhook.tlsSecret" .) -}}
{{- if and $existing $existing.data (hasKey $existing.data "ca.crt") (hasKey $existing.data "tls.crt") (hasKey $existing.data "tls.key") -}}
{{- $material = dict "ca" (index $existing.data "ca.crt" | b64dec) "cert" (index $existing.data "tls.crt" | b64dec) "key" (index $existing.data "tls.key" | b64dec) -}}
{{- else -}}
{{- $days := int .Values.webhook.tls.chart.validityDays -}}
{{- $ca := genCA (printf "%s-ca" (include "tessera.webhook.name" .)) $days -}}
{{- $svc := include "tessera.webhook.name" . -}}
{{- $names := list (printf "%s.%s.svc" $svc .Release.Namespace) (printf "%s.%s.svc.cluster.local" $svc .Release.Namespace) -}}
{{- $cert := genSignedCert (include "tessera.webhook.host" .) nil $names $days $ca -}}
{{- $material = dict "ca" $ca.Cert "cert" $cert.Cert "key" $cert.Key -}}
{{- end -}}
{{- $_ := set $memo "_material" $material -}}
{{- end -}}
{{- toYaml (get $memo "_material") -}}
{{- end -}}

{{/*
A Kubernetes quantity from a value, as a string: Helm reads numbers as floats, which print as
"1e+06"; whole numbers are written as integers, strings ("320Gi") as they are.
*/}}
{{- define "tessera.quantity" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) -}}
{{- int64 . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/*
The NetworkPolicy ingress rule that admits the scrapers (networkPolicy.scrapers, Prometheus by
default) to one port of a component's pods: include with (dict "root" $ "port" 8080).
*/}}
{{- define "tessera.networkPolicy.scrapers" -}}
- ports:
    - port: {{ .port }}
      protocol: TCP
  from:
    {{- toYaml .root.Values.networkPolicy.scrapers | nindent 4 }}
{{- end -}}
