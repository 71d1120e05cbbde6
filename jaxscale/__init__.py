"""jaxscale: a JAX sharding laboratory."""

__version__ = "0.1.0"
