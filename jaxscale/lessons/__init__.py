"""The seeds' chapter demonstrations in SPMD form (hello, relay chain, collectives cheatsheet,
column/row checks, ...), kept apart from the strategies they teach: ranks.py (seed 002 ch1-2),
collectives.py (ch3-4), data_parallel.py (ch5: the three DP forms, gradient bucketing), tensor.py
(ch6), hello.py (the `jaxscale hello` command)."""
