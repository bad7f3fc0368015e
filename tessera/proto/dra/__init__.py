"""The DRA node service the kubelet calls to prepare and unprepare claims."""
