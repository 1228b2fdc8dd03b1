"""Migration scripts, one per schema change, oldest first (``revision`` / ``down_revision`` chain them)."""
