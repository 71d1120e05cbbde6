"""RLHF on the lab's transformer (seed 002 ch13-14, `jaxscale rlhf`, docs/rlhf.md): the task and
its true score (`task`), the SFT actor and the reward model (`setup`), the four models on the
training pieces (`models`), KL-shaped rewards and advantages (`rewards`, with `jaxscale.rl.gae`),
the generate, score and train phases as jitted programs (`phases`), the meshes they run on and the
weight transfer between them (`placement`), the loop (`run`), what a run reports beside its curves
(`report`), and the command line (`config`, `cli`)."""
