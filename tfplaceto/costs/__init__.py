"""Cost profiles: per-op compute time on each device kind (analytical, measured, or loaded)."""
