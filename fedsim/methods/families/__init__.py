"""Family bases: what a few registered methods share (feature alignment, pooled references, dataset dictionaries,
detection), built from the method-agnostic pieces in :mod:`fedsim.methods.common`."""
