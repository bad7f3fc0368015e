"""``tessera-webview``: a read-only web page of the cluster's GPUs, their shares and the GPU pods
that wait, with why (docs/webview.md).

Optional in the chart (``webview.enabled``, off by default). Server-rendered (Flask and Jinja2,
served by waitress), no script at all; it reads with a read-only ServiceAccount what ``kubectl
tessera`` reads, and shows it with the plugin's own views and judgement.
"""
