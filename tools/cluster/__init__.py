"""Files that tools/cluster_check.py puts on the node it emulates."""
