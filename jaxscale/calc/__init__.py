"""Pure-Python analytic models (no jax import), so `jaxscale calc` answers instantly."""
