"""What several `jaxscale calc` commands share: the model-shape and GPU flags, the header line,
records and cell formats.

Imports none of the command modules (they import it), and no jax.
"""

from dataclasses import asdict, replace

from jaxscale.calc import inference as inf
from jaxscale.calc import kv
from jaxscale.calc.models import SHAPE_PRESETS, ModelPreset, get_model
from jaxscale.cliutil import parse_count, positive_float, positive_int
from jaxscale.hardware import Device, get_device
from jaxscale.render import fmt_count

GPUS = ("h100", "a100", "a100-40", "4090", "h200")  # --gpu choices, keys of jaxscale.hardware


def record(obj, *properties: str, **extra) -> dict:
    """A frozen dataclass as a JSON-ready dict: its fields, the named properties, and extras."""
    return {**asdict(obj), **{name: getattr(obj, name) for name in properties}, **extra}


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def per(unit: float, spec: str):
    """Cell format of a value in `unit`s: per(1e9, '.3f') writes bytes as GB."""
    return lambda value: format(value / unit, spec)


def billions(x: float) -> str:
    return f"{x / 1e9:,.1f}B"


def add_model_flags(p, default: str = "llama-70b") -> None:
    p.add_argument("--model", default=default, choices=list(SHAPE_PRESETS), help="a preset")
    p.add_argument("--params", type=parse_count, help="override the parameter count, e.g. 70B")
    p.add_argument("--layers", type=positive_int, help="override the number of layers")
    p.add_argument("--d-model", type=positive_int, help="override the hidden size")
    p.add_argument("--kv-heads", type=positive_int, help="override the K/V heads (GQA)")
    p.add_argument("--head-dim", type=positive_int, help="override the head dimension")


def model_from_args(args) -> ModelPreset:
    """--model with the shape flags given on the command line replacing its fields."""
    m = get_model(args.model)
    return replace(
        m,
        n_params=args.params or m.n_params,
        n_layers=args.layers or m.n_layers,
        d_model=args.d_model or m.d_model,
        n_kv_heads=args.kv_heads or m.n_kv_heads,
        head_dim=args.head_dim or m.head_dim,
    )


def kv_bytes_per_token(model: ModelPreset, seed_faithful: bool = False) -> int:
    """Corrected: K/V heads (GQA); seed 001: every d_model channel (§9)."""
    if seed_faithful:
        return inf.seed_kv_bytes_per_token(model.n_layers, model.d_model)
    return kv.kv_bytes_per_token(model.n_layers, model.n_kv_heads, model.head_dim)


def add_gpu_flags(p) -> None:
    p.add_argument("--gpu", choices=GPUS, help="default h100 at seed 001's 990 TFLOPS")
    p.add_argument("--gpu-tflops", type=positive_float, help="override the peak dense TFLOP/s")
    p.add_argument("--hbm-tbs", type=positive_float, help="override the memory bandwidth, TB/s")


def gpu_from_args(args) -> Device:
    """--gpu from jaxscale/hardware.py; without it seed 001's H100 (990 TFLOPS, not 989.5), so the
    seed's tables print its numbers."""
    g = inf.SEED001_H100 if args.gpu is None else get_device(args.gpu)
    g = replace(
        g, bf16_tflops=args.gpu_tflops or g.bf16_tflops, hbm_tb_s=args.hbm_tbs or g.hbm_tb_s
    )
    if g.bf16_tflops is None or g.hbm_tb_s is None:
        raise ValueError(f"no FLOP/s or bandwidth known for {g.name}: pass --gpu-tflops, --hbm-tbs")
    return g


def header(model: ModelPreset, gpu: Device) -> str:
    return (
        f"{model.name} ({fmt_count(model.n_params)} params) on {gpu.name} "
        f"({gpu.bf16_tflops:g} TFLOPS, {gpu.hbm_tb_s:g} TB/s)"
    )
