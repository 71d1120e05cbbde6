"""One module per `jaxscale calc NAME` command: `add_parser(calc_sub)` registers it and its
handler runs it; the formulas live in the topic modules (calc/flops.py, calc/kv.py, ...) and the
flags several commands share in `common.py`. Nothing here imports jax."""
