"""The model: NNX parameters with logical axis names (transformer.py) and the forward pass as
pure pieces every strategy composes (pieces.py)."""
