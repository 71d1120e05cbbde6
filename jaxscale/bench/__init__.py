"""The mesh comparison harness and its report."""
