"""Process launching: local loopback clusters, one host's task, horovodrun."""
