"""Kubelet plugin registration (proto package ``pluginregistration``)."""
