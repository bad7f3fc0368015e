"""DRA device health, streamed from the plugin to the kubelet."""
