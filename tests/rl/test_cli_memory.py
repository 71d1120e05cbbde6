"""`jaxscale rl` refuses a seed count whose runs cannot fit in memory, before compiling."""

from jaxscale.cli import main as cli_main
from jaxscale.rl.cli import seed_bytes
from jaxscale.rl.config import RLConfig


def test_a_seed_count_beyond_memory_is_refused_at_once(capsys):
    """Before: 100,000,000 seeds ran out of memory after 40 s."""
    assert cli_main(["rl", "ppo", "--seeds", "100000000"]) == 2
    err = capsys.readouterr().err
    assert "--seeds 100000000: at least" in err and "run fewer seeds" in err


def test_one_seed_holds_at_least_its_rollout_and_adam_state():
    cfg = RLConfig()
    rollout = cfg.num_steps * cfg.num_envs * 4 * 4  # observations alone, f32
    assert seed_bytes(cfg) > rollout
    assert seed_bytes(cfg.replace(num_envs=2 * cfg.num_envs)) > seed_bytes(cfg)
