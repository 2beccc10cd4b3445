"""Real measurement: run placed graphs on local devices or a TensorFlow cluster."""
